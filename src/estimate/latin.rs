//! Words of Latin letters: ASCII words with accented letters among them (Latin-1, Extended-A, the
//! Vietnamese block), read as o200k's pre-tokenizer splits them (capitals, then lower-case letters),
//! each looked up in the word table and counted (see `scan_word`); `scan_words` reads the words after
//! it that single spaces separate without going back to the byte-wise loop of `text.rs`.

use super::bytes::{bump, count_while, count_word, lower_run, not_lower_mask, Counts};
use super::weights::{feature, SHORT_PROBES};
use super::words::{known, known_low, load, rare_pairs, short_known, MIN_ASCII};

/// The accented Latin letters ([`is_latin_ext`]) of two UTF-8 bytes: one row per lead byte
/// 0xC3..=0xCA, bit `b1 & 63` set where the second byte `b1` makes one (U+00D7 × and U+00F7 ÷ are
/// not letters; U+02B0 on are modifier letters).
const EXT2: [u64; 8] = [
    !((1 << 0x17) | (1 << 0x37)),
    u64::MAX,
    u64::MAX,
    u64::MAX,
    u64::MAX,
    u64::MAX,
    u64::MAX,
    (1 << 0x30) - 1,
];

/// Of [`EXT2`], the letters of Latin Extended-A (U+0100..=U+017F, lead bytes 0xC4 and 0xC5) but for
/// U+0110 Đ and U+0111 đ: those counted by [`feature::LATIN_EXT_A`], the others by
/// [`feature::LATIN_EXT`].
const EXT2_A: [u64; 8] = [0, !(0b11 << 0x10), u64::MAX, 0, 0, 0, 0, 0];

/// [`EXT2`] and [`EXT2_A`] as one byte per letter (one load a letter), at `(b0 - 0xC3) << 6 | b1 &
/// 63`: bit 0 set for an accented letter, bit 1 for one of [`feature::LATIN_EXT_A`].
const EXT2_KIND: [u8; 512] = {
    let mut t = [0u8; 512];
    let mut k = 0;
    while k < 512 {
        let (row, bit) = (k >> 6, k & 63);
        #[allow(clippy::indexing_slicing)] // compile time: out of range fails the build
        {
            t[k] = ((EXT2[row] >> bit) & 1 | ((EXT2_A[row] >> bit) & 1) << 1) as u8;
        }
        k += 1;
    }
    t
};

/// The accented letters of [`EXT2_KIND`] and the Vietnamese block by the low six bits of their lead
/// byte and of the byte after it, at `(b0 & 63) | (b1 & 63) << 8` (the two bytes of a
/// little-endian word masked by `0x3F3F`: no shifts; 16 KB, of which only the columns of lead
/// bytes 0xC3..=0xCA and 0xE1 are read), as counts to add up (see [`short_word`]): 0 for no
/// letter, else its continuation bytes (1 or 2) plus 16 for one of [`feature::LATIN_EXT_A`] (lead
/// bytes 0xC3..=0xCA, [`EXT2_KIND`]); a letter of three bytes is 0xE1 before 0xB8..=0xBB
/// (U+1E00..=U+1EFF). Valid only where the caller knows that `b0` is a lead byte and the bytes
/// after it continuation bytes.
static EXT_LEAD: [u8; EXT_LEAD_LEN] = {
    let mut t = [0u8; EXT_LEAD_LEN];
    let mut k = 0;
    while k < EXT_LEAD_LEN {
        let (b0, b1) = (k & 63, (k >> 8) & 63);
        #[allow(clippy::indexing_slicing)] // compile time: out of range fails the build
        {
            if k & 0xC0C0 != 0 {
                // Not a masked index.
            } else if b0 >= 0xC3 & 63 && b0 <= 0xCA & 63 {
                let kind = EXT2_KIND[(b0 - (0xC3 & 63)) << 6 | b1];
                t[k] = (kind & 1) | (kind >> 1) << 4;
            } else if b0 == 0xE1 & 63 && b1 >= 0xB8 & 63 && b1 <= 0xBB & 63 {
                t[k] = 2;
            }
        }
        k += 1;
    }
    t
};

/// [`EXT_LEAD`]'s length: every index masked by `0x3F3F`.
const EXT_LEAD_LEN: usize = 0x3F3F + 1;

/// The accented letter of the two bytes `b0` (0xC3..=0xCA) and `b1` (0x80..=0xBF), if they make
/// one: whether it counts as [`feature::LATIN_EXT_A`].
#[inline(always)]
fn ext2(b0: u8, b1: u8) -> Option<bool> {
    let kind = EXT2_KIND
        .get(usize::from(b0.wrapping_sub(0xC3)) << 6 | usize::from(b1 & 63))
        .copied()
        .unwrap_or(0);
    (kind != 0).then_some(kind > 1)
}

/// The accented Latin letter at `i` ([`is_latin_ext`]): its length (2 or 3 bytes) and whether it
/// counts as [`feature::LATIN_EXT_A`] (else [`feature::LATIN_EXT`]). No UTF-8 decode: [`ext2`] for
/// two bytes, the lead byte 0xE1 and the second's range for U+1E00..=U+1EFF (Latin
/// Extended Additional: Vietnamese).
#[inline(always)]
pub(super) fn latin_ext_at(bytes: &[u8], i: usize) -> Option<(usize, bool)> {
    match *bytes.get(i..)? {
        [b0 @ 0xC3..=0xCA, b1 @ 0x80..=0xBF, ..] => ext2(b0, b1).map(|a| (2, a)),
        [0xE1, 0xB8..=0xBB, 0x80..=0xBF, ..] => Some((3, false)),
        _ => None,
    }
}

/// [`latin_ext_at`] of the letter whose bytes are the low three of `w` (little-endian).
#[inline(always)]
fn latin_ext_in(w: u64) -> Option<(usize, bool)> {
    let [b0, b1, b2, ..] = w.to_le_bytes();
    match (b0, b1, b2) {
        (0xC3..=0xCA, 0x80..=0xBF, _) => ext2(b0, b1).map(|a| (2, a)),
        (0xE1, 0xB8..=0xBB, 0x80..=0xBF) => Some((3, false)),
        _ => None,
    }
}

/// The eight bytes at `i` as a little-endian word, if there are eight.
#[inline(always)]
fn load8(bytes: &[u8], i: usize) -> Option<u64> {
    bytes
        .get(i..i.wrapping_add(8))
        .and_then(|c| <[u8; 8]>::try_from(c).ok())
        .map(u64::from_le_bytes)
}

/// Whether `cp` is an accented Latin letter (of Latin-1, Latin Extended-A and -B, IPA, or Latin
/// Extended Additional).
#[inline(always)]
pub(super) fn is_latin_ext(cp: u32) -> bool {
    matches!(cp, 0xC0..=0xD6 | 0xD8..=0xF6 | 0xF8..=0x2AF | 0x1E00..=0x1EFF)
}

/// The lower-case and accented letters of a word from its first one that is not a capital (see
/// [`scan_word`]).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Tail {
    /// The index after the word.
    end: usize,
    /// Its letters (from where it was read), each accented one one.
    letters: usize,
    /// Its accented letters ([`is_latin_ext`]).
    ext: u64,
    /// Those of them counted as [`feature::LATIN_EXT_A`].
    ext_a: u64,
    /// Those of them right after another accented letter.
    pairs: u64,
}

/// The [`Tail`] of a word at `i`. Where the word ends within the 16 bytes at `i` (most words), from
/// one load or two (no step per letter): its end is the first byte that is neither a lower-case ASCII letter nor
/// non-ASCII, and each non-ASCII character before it is read as an accented letter, the first that
/// is not one ending the word. Else (longer words, the last bytes of the text) [`tail_steps`].
#[inline(always)]
pub(super) fn word_tail(bytes: &[u8], i: usize) -> Tail {
    const HI: u64 = 0x8080_8080_8080_8080;
    if let Some(w) = load8(bytes, i) {
        let high = w & HI;
        let stop = not_lower_mask(w) & !high;
        if stop != 0 {
            return tail_in8(i, w, high, stop.trailing_zeros() / 8);
        }
        // Words of 8 to 15 bytes: the next eight.
        if let Some(w2) = load8(bytes, i + 8) {
            let high2 = w2 & HI;
            let stop2 = not_lower_mask(w2) & !high2;
            if stop2 != 0 {
                let w = u128::from(w) | (u128::from(w2) << 64);
                let high = u128::from(high) | (u128::from(high2) << 64);
                return tail_in(i, w, high, 8 + stop2.trailing_zeros() / 8);
            }
        }
    }
    tail_steps(bytes, i)
}

/// [`word_tail`] a step at a time: a run of lower-case letters, an accented letter, and again.
#[inline(always)]
pub(super) fn tail_steps(bytes: &[u8], i: usize) -> Tail {
    // Index arithmetic below is bounded by `bytes.len()`, so it cannot overflow.
    let mut i = i;
    let mut letters = 0;
    // The letter before is an accented one.
    let mut after_ext = false;
    let (mut ext, mut ext_a, mut pairs) = (0u64, 0u64, 0u64);
    loop {
        // One load a step where eight bytes remain: the run of lower-case letters and, when it
        // ends within the first six, the next letter's bytes.
        let (lower, next) = match load8(bytes, i) {
            Some(w) => {
                let m = not_lower_mask(w);
                if m == 0 {
                    (8 + lower_run(bytes, i + 8), None)
                } else {
                    let k = (m.trailing_zeros() / 8) as usize;
                    (k, (k <= 5).then(|| w >> (8 * k)))
                }
            }
            None => (lower_run(bytes, i), None),
        };
        i += lower;
        letters += lower;
        after_ext &= lower == 0;
        let letter = match next {
            Some(w) => latin_ext_in(w),
            None => latin_ext_at(bytes, i),
        };
        match letter {
            Some((n, a)) => {
                i += n;
                letters += 1;
                ext += 1;
                ext_a += u64::from(a);
                pairs += u64::from(after_ext);
                after_ext = true;
            }
            None => break,
        }
    }
    Tail {
        end: i,
        letters,
        ext,
        ext_a,
        pairs,
    }
}

/// Defines `$name(i, w, high, t) -> Tail` over words of `$ty`: the [`Tail`] of a word at `i` whose
/// bytes from `i` are the low bytes of `w`, `high` the high bit of each of them that is not ASCII, `t`
/// (< the width in bytes) the first that is neither a lower-case letter nor non-ASCII: each non-ASCII
/// character before `t` is read as an accented letter, the first that is not one ending the word.
macro_rules! tail_in {
    ($(#[$doc:meta])* $name:ident, $ty:ty) => {
        $(#[$doc])*
        #[inline(always)]
        fn $name(i: usize, w: $ty, high: $ty, t: u32) -> Tail {
            let mut rest = high & !(<$ty>::MAX << (8 * t));
            // The word's bytes, the continuation bytes of its accented letters, and where the last
            // accented letter ended (the width: none yet).
            let (mut end, mut cont, mut after) = (t, 0u32, <$ty>::BITS / 8);
            let (mut ext, mut ext_a, mut pairs) = (0u64, 0u64, 0u64);
            while rest != 0 {
                let q = rest.trailing_zeros() / 8;
                // The bytes of a letter at `q` are non-ASCII, so before `t`: `q + n <= t`.
                #[allow(clippy::unnecessary_cast)] // u128 → u64 in one of the two
                match latin_ext_in((w >> (8 * q)) as u64) {
                    Some((n, a)) => {
                        ext += 1;
                        ext_a += u64::from(a);
                        pairs += u64::from(q == after);
                        after = q + n as u32;
                        cont += n as u32 - 1;
                        // Its bytes off (each shift < the width; the bits past the top fall off).
                        rest &= (<$ty>::MAX << (8 * q)) << (8 * n);
                    }
                    None => {
                        end = q;
                        break;
                    }
                }
            }
            Tail {
                end: i + end as usize,
                letters: (end - cont) as usize,
                ext,
                ext_a,
                pairs,
            }
        }
    };
}

tail_in!(
    /// A word that may end within sixteen bytes.
    tail_in,
    u128
);
tail_in!(
    /// A word that ends within eight bytes (most words: cheaper than in 128 bits).
    tail_in8,
    u64
);

/// The number of bytes of `m` whose high bit is set (`m`: high bits only).
#[inline(always)]
fn count_high(m: u64) -> u64 {
    // Each byte of `m >> 7` is 0 or 1: their sum, at most 8, in the top byte.
    (m >> 7).wrapping_mul(0x0101_0101_0101_0101) >> 56
}

/// A word of lower-case and accented letters at `start` that ends within the eight bytes there
/// (most words of European languages and Vietnamese; [`long_word`] for those of 8 to 15 bytes),
/// counted as [`scan_word`] counts it (after a space if `space`, after punctuation if
/// `after_punct`): the index after it and whether a space follows it; `None` (nothing counted) for
/// the rest: a capital or no letter at `start`, a word of sixteen bytes or more (but for `first`,
/// [`scan_words`]' first word: [`long_run`]), fewer than eight bytes left (sixteen for a longer
/// word), a non-ASCII character that is not an accented letter of two or three bytes. Its letters
/// from masks (the lead bytes, the continuation bytes and the letters' ends; one table load a
/// letter, [`EXT_LEAD`], to tell it and its feature), the word-table lookup from the same eight
/// bytes, and an accented letter's feature counts and pairs only for a word the table does not
/// know.
#[inline(always)]
fn short_word(
    bytes: &[u8],
    start: usize,
    f: &mut Counts,
    space: bool,
    after_punct: bool,
    first: bool,
) -> Option<(usize, bool)> {
    const HI: u64 = 0x8080_8080_8080_8080;
    let w = load8(bytes, start)?;
    let high = w & HI;
    let stop = not_lower_mask(w) & !high;
    if stop == 0 {
        return long_word(bytes, start, w, f, space, after_punct, first);
    }
    let t = stop.trailing_zeros() / 8;
    if t == 0 {
        return None;
    }
    // The byte after the word (`t` < 8: within `w`).
    let spaced = (w >> (8 * t)) as u8 == b' ';
    let end = start + t as usize;
    // The high bits of the bytes before `t` (those of `stop` above it are not high bits).
    let region = high & stop.wrapping_sub(1);
    let len = t as usize;
    if region == 0 {
        // ASCII lower-case letters only (as `count_read_word` counts them).
        if after_punct {
            bump(f, feature::PUNCT_WORD, 1);
        }
        if len >= MIN_ASCII {
            if known_low(w, len, space) {
                bump(f, known_feature(space), 1);
                return Some((end, spaced));
            }
            bump(f, feature::LATIN_RARE_PAIR, rare_pairs(bytes, start, end));
        } else if len >= 3 {
            short_unknown(f, w, len);
        }
        count_word(f, len);
        return Some((end, spaced));
    }
    // Lead bytes (0b11xxxxxx: bit 6 shifted onto bit 7) and of them those of three bytes or more
    // (0b111xxxxx); the others must be continuation bytes, exactly those the leads need.
    let leads = region & (w << 1);
    let long = leads & (w << 2);
    if region & !leads != (leads << 8 | long << 16) {
        return None;
    }
    // [`EXT_LEAD`]'s counts of the letters: at most four (eight bytes), so the fields (continuation
    // bytes in bits 0..4, letters of Latin Extended-A in 4..7) do not carry into each other. The
    // first lead byte out of the loop (there is one: `region` is not empty and is not all
    // continuation bytes); most words have one accented letter.
    let kind = |at: u64| {
        // The lead byte at the low bits of `v`, the next byte above it.
        let v = w >> (at.trailing_zeros() & 0x38);
        EXT_LEAD.get((v & 0x3F3F) as usize).copied().unwrap_or(0)
    };
    let mut sum = u32::from(kind(leads));
    if sum == 0 {
        return None;
    }
    let mut rest = leads & leads.wrapping_sub(1);
    while rest != 0 {
        let k = kind(rest);
        if k == 0 {
            return None;
        }
        sum += u32::from(k);
        rest &= rest - 1;
    }
    if after_punct {
        bump(f, feature::PUNCT_WORD, 1);
    }
    // The word's letters: its bytes but the continuation bytes (at least one accented letter).
    let letters = t - (sum & 15);
    if letters >= 2 && known_low(w, len, space) {
        bump(f, known_feature(space), 1);
        return Some((end, spaced));
    }
    // Where each letter ends: an accented letter there follows another.
    let ends = (leads ^ long) << 16 | long << 24;
    let tail = Tail {
        end,
        letters: letters as usize,
        ext: count_high(leads),
        ext_a: u64::from((sum >> 4) & 7),
        pairs: count_high(leads & ends),
    };
    Some((
        count_read_word(bytes, f, start, 0, &tail, space, false, true),
        spaced,
    ))
}

/// [`short_word`] of a word of one capital then lower-case and accented letters that ends within
/// the eight bytes at `start` (names, the first word of a sentence): its letters from the same
/// masks, the capital read as its lower-case letter; counted by [`count_read_word`]. `None`
/// (nothing counted) for the rest: no capital at `start`, two capitals, a longer word, a character
/// that is not an accented letter.
#[inline(always)]
fn capitalised(
    bytes: &[u8],
    start: usize,
    w: u64,
    f: &mut Counts,
    space: bool,
    after_punct: bool,
) -> Option<(usize, bool)> {
    const HI: u64 = 0x8080_8080_8080_8080;
    if !(w as u8).is_ascii_uppercase() || ((w >> 8) as u8).is_ascii_uppercase() {
        return None;
    }
    let high = w & HI;
    let stop = not_lower_mask(w | 0x20) & !high;
    if stop == 0 {
        return None;
    }
    let t = stop.trailing_zeros() / 8;
    let spaced = (w >> (8 * t)) as u8 == b' ';
    // As in [`short_word`] (the capital is not a high byte).
    let region = high & stop.wrapping_sub(1);
    let leads = region & (w << 1);
    let long = leads & (w << 2);
    if region & !leads != (leads << 8 | long << 16) {
        return None;
    }
    let (mut rest, mut sum) = (leads, 0u32);
    while rest != 0 {
        let v = w >> (rest.trailing_zeros() & 0x38);
        let kind = EXT_LEAD.get((v & 0x3F3F) as usize).copied().unwrap_or(0);
        if kind == 0 {
            return None;
        }
        sum += u32::from(kind);
        rest &= rest - 1;
    }
    let ends = (leads ^ long) << 16 | long << 24;
    let tail = Tail {
        end: start + t as usize,
        letters: (t - 1 - (sum & 15)) as usize,
        ext: count_high(leads),
        ext_a: u64::from((sum >> 4) & 7),
        pairs: count_high(leads & ends),
    };
    let i = count_read_word(bytes, f, start, 1, &tail, space, after_punct, false);
    Some((i, spaced))
}

/// [`short_word`] of a word of 8 to 15 bytes (`w`: its first eight): the same from sixteen bytes,
/// the masks in 128 bits, the lookup by [`known`].
#[inline(always)]
fn long_word(
    bytes: &[u8],
    start: usize,
    w: u64,
    f: &mut Counts,
    space: bool,
    after_punct: bool,
    first: bool,
) -> Option<(usize, bool)> {
    const HI: u64 = 0x8080_8080_8080_8080;
    let w2 = load8(bytes, start + 8)?;
    let stop = not_lower_mask(w2) & !(w2 & HI);
    if stop == 0 {
        return if first {
            long_run(bytes, start, f, space, after_punct)
        } else {
            None
        };
    }
    // 8..=15; the byte after the word in `w2`.
    let t = 8 + stop.trailing_zeros() / 8;
    let spaced = (w2 >> (8 * (t - 8))) as u8 == b' ';
    let end = start + t as usize;
    let len = t as usize;
    // The high bits of the bytes before `t`, as in [`short_word`].
    let region = u128::from(w & HI) | u128::from(w2 & HI & stop.wrapping_sub(1)) << 64;
    let w = u128::from(w) | u128::from(w2) << 64;
    if region == 0 {
        // ASCII lower-case letters only: at least eight, so looked up.
        if after_punct {
            bump(f, feature::PUNCT_WORD, 1);
        }
        if known(bytes, start, end, space) {
            bump(f, known_feature(space), 1);
        } else {
            bump(f, feature::LATIN_RARE_PAIR, rare_pairs(bytes, start, end));
            count_word(f, len);
        }
        return Some((end, spaced));
    }
    // As in [`short_word`].
    let leads = region & (w << 1);
    let long = leads & (w << 2);
    if region & !leads != (leads << 8 | long << 16) {
        return None;
    }
    // At most seven letters of two or more bytes (fifteen bytes): the fields of `sum` (at most 14
    // continuation bytes, 7 letters of Latin Extended-A) do not carry into each other.
    let (mut rest, mut sum) = (leads, 0u32);
    while rest != 0 {
        let v = (w >> (rest.trailing_zeros() & 0x78)) as u64;
        let kind = EXT_LEAD.get((v & 0x3F3F) as usize).copied().unwrap_or(0);
        if kind == 0 {
            return None;
        }
        sum += u32::from(kind);
        rest &= rest - 1;
    }
    if after_punct {
        bump(f, feature::PUNCT_WORD, 1);
    }
    let letters = t - (sum & 15);
    if letters >= 2 && known(bytes, start, end, space) {
        bump(f, known_feature(space), 1);
        return Some((end, spaced));
    }
    let ends = (leads ^ long) << 16 | long << 24;
    let pairs = leads & ends;
    let tail = Tail {
        end,
        letters: letters as usize,
        ext: count_high(leads as u64) + count_high((leads >> 64) as u64),
        ext_a: u64::from((sum >> 4) & 7),
        pairs: count_high(pairs as u64) + count_high((pairs >> 64) as u64),
    };
    Some((
        count_read_word(bytes, f, start, 0, &tail, space, false, true),
        spaced,
    ))
}

/// [`scan_words`]' first word where it has sixteen bytes or more (random letters, long compounds),
/// a step at a time ([`tail_steps`]); `None` where no letter is at `start` (out of line: rare in
/// text).
#[inline(never)]
fn long_run(
    bytes: &[u8],
    start: usize,
    f: &mut Counts,
    space: bool,
    after_punct: bool,
) -> Option<(usize, bool)> {
    let tail = tail_steps(bytes, start);
    if tail.letters == 0 {
        return None;
    }
    let i = count_read_word(bytes, f, start, 0, &tail, space, after_punct, false);
    Some((i, bytes.get(i) == Some(&b' ')))
}

/// Scan one word of Latin letters starting at `i`: upper-case letters then lower-case ones (accented
/// letters count as lower case), so "camelCase" is two words and "HTTPServer" one, like o200k's
/// pre-tokenizer. Returns the index after the word (always > `i`).
#[inline(always)]
pub(super) fn scan_word(bytes: &[u8], start: usize, f: &mut Counts, after_punct: bool) -> usize {
    // Index arithmetic here is bounded by `bytes.len()`, so it cannot overflow.
    let upper = capitals(bytes, start);
    let tail = word_tail(bytes, start + upper);
    if upper + tail.letters == 0 {
        return start + 1; // not called on a non-letter; guarantees progress anyway
    }
    let space = space_before(bytes, start);
    count_read_word(bytes, f, start, upper, &tail, space, after_punct, false)
}

/// The capitals at `i` (their number).
#[inline(always)]
fn capitals(bytes: &[u8], i: usize) -> usize {
    if bytes.get(i).is_some_and(u8::is_ascii_uppercase) {
        count_while(bytes, i, |b| b.is_ascii_uppercase())
    } else {
        0
    }
}

/// Counts the word at `start` of `upper` capitals then `tail` (at least one letter), after a space
/// if `space` (see [`scan_word`]); `looked_up`: the caller has found it not in the word table.
/// Returns the index after it.
#[inline(always)]
#[allow(clippy::too_many_arguments)] // inlined in every caller, where the flags are constants
fn count_read_word(
    bytes: &[u8],
    f: &mut Counts,
    start: usize,
    upper: usize,
    tail: &Tail,
    space: bool,
    after_punct: bool,
    looked_up: bool,
) -> usize {
    let i = tail.end;
    let letters = upper + tail.letters;
    // Lower-case or accented letters after the capitals.
    let mixed = tail.letters > 0;
    let (ext_a, ext_other, pairs) = (tail.ext_a, tail.ext - tail.ext_a, tail.pairs);
    if after_punct {
        bump(f, feature::PUNCT_WORD, 1);
    }
    // A word the table knows is one token (see `words.rs`): plain ASCII words of five letters or
    // more, words with accented letters of two or more.
    let accented = ext_a + ext_other > 0;
    if letters >= if accented { 2 } else { MIN_ASCII } {
        let len = i - start;
        // A word of up to eight bytes: hashed from its first eight, loaded once here.
        let is_known = !looked_up
            && match load8(bytes, start) {
                Some(w) if len <= 8 => known_low(w, len, space),
                _ => known(bytes, start, i, space),
            };
        if is_known {
            bump(f, known_feature(space), 1);
            return i;
        }
        // All-capital words too (random capitals are about a token for two letters).
        if !accented && (upper <= 1 || !mixed) {
            bump(f, feature::LATIN_RARE_PAIR, rare_pairs(bytes, start, i));
        }
    } else if upper == 0 && !accented && letters >= 3 {
        let w = load(bytes, start);
        short_unknown(f, w, letters);
    } else if !mixed && letters >= 3 {
        bump(f, feature::LATIN_RARE_PAIR, rare_pairs(bytes, start, i));
    }
    if mixed {
        bump(f, feature::LATIN_EXT_A, ext_a);
        bump(f, feature::LATIN_EXT, ext_other);
        bump(f, feature::LATIN_EXT_PAIR, pairs);
    }
    count_word(f, letters);
    if upper > 0 {
        let upper = u64::try_from(upper).unwrap_or(u64::MAX);
        bump(f, feature::UPPER, upper);
        if !mixed && upper >= 2 {
            bump(f, feature::CAPS_WORD_CHARS, upper);
        }
    }
    i
}

/// Counts the lower-case word of `len` (3 or 4) letters whose bytes are the low ones of `w` in
/// [`feature::LATIN_SHORT_UNKNOWN`] if it is not an o200k token after a space (see `short_known` in
/// `words.rs`): the first [`SHORT_PROBES`] such words of a text, and all of them once two were not
/// tokens ([`feature::SHORT_ASKED`]). Prose has some 50 such words a KB and nearly all are tokens:
/// asking each cost English 6 % more instructions, asking only where random ones were seen costs
/// two loads and a test.
#[inline(always)]
pub(super) fn short_unknown(f: &mut Counts, w: u64, len: usize) {
    let asked = f.get(feature::SHORT_ASKED).copied().unwrap_or(0);
    let unknown = f.get(feature::LATIN_SHORT_UNKNOWN).copied().unwrap_or(0);
    if asked < SHORT_PROBES || unknown >= 2 {
        bump(f, feature::SHORT_ASKED, 1);
        bump(
            f,
            feature::LATIN_SHORT_UNKNOWN,
            u64::from(!short_known(w, len)),
        );
    }
}

/// Whether the byte before `i` is a space (a word there is looked up with its leading space).
#[inline(always)]
pub(super) fn space_before(bytes: &[u8], i: usize) -> bool {
    bytes.get(i.wrapping_sub(1)) == Some(&b' ')
}

/// The feature of a Latin word the table knows: [`feature::LATIN_KNOWN`] after a space, else
/// [`feature::LATIN_KNOWN_BARE`].
#[inline(always)]
pub(super) fn known_feature(space: bool) -> usize {
    if space {
        feature::LATIN_KNOWN
    } else {
        feature::LATIN_KNOWN_BARE
    }
}

/// Counts a word of `len` ASCII lower-case letters at `i` (not after an ASCII letter): one known
/// word, or by its length. `w`: the eight bytes at `i` if the word is shorter than eight letters.
#[inline(always)]
pub(super) fn count_lower_word(bytes: &[u8], f: &mut Counts, i: usize, len: usize, w: Option<u64>) {
    if len >= MIN_ASCII {
        let space = space_before(bytes, i);
        let is_known = match w {
            Some(w) => known_low(w, len, space),
            None => known(bytes, i, i + len, space),
        };
        if is_known {
            bump(f, known_feature(space), 1);
            return;
        }
        bump(f, feature::LATIN_RARE_PAIR, rare_pairs(bytes, i, i + len));
    } else if len >= 3 {
        let w = w.unwrap_or_else(|| load(bytes, i));
        short_unknown(f, w, len);
    }
    count_word(f, len);
}

/// [`scan_word`] from `start`, then the words after it that only a single space separates (a single
/// space before a letter has no feature of its own, see [`count_features`]): text with accented
/// letters (European languages, Vietnamese) is read word after word without going back to the
/// byte-wise loop. Each word of up to fifteen bytes by [`short_word`], the others out of line
/// ([`first_word`], [`other_word`]). Returns the index after the last word.
#[inline(never)]
pub(super) fn scan_words(bytes: &[u8], start: usize, f: &mut Counts, after_punct: bool) -> usize {
    let (mut i, mut spaced) = match short_word(
        bytes,
        start,
        f,
        space_before(bytes, start),
        after_punct,
        true,
    ) {
        Some(word) => word,
        None => first_word(bytes, start, f, after_punct),
    };
    // `i + 1` ≤ `bytes.len()` where it is used: the byte at `i` is a space.
    while spaced {
        // A word after the space, if a letter follows it: read as `scan_word` reads it.
        let start = i + 1;
        if let Some((end, next)) = short_word(bytes, start, f, true, false, false) {
            (i, spaced) = (end, next);
            continue;
        }
        match other_word(bytes, start, f) {
            Some(word) => (i, spaced) = word,
            None => break,
        }
    }
    i
}

/// [`scan_word`] of `scan_words`' first word where [`short_word`] does not take it, and whether a
/// space follows it (out of line: [`short_word`]'s loop stays small).
#[inline(never)]
fn first_word(bytes: &[u8], start: usize, f: &mut Counts, after_punct: bool) -> (usize, bool) {
    let i = scan_word(bytes, start, f, after_punct);
    (i, bytes.get(i) == Some(&b' '))
}

/// A word after a space at `start` that [`short_word`] does not take, as [`scan_word`] reads it
/// ([`capitalised`] first): the index after it and whether a space follows it; `None` (nothing
/// counted) where no letter is at `start` (out of line: [`short_word`]'s loop stays small; in
/// [`short_word`] itself [`capitalised`] cost the loop's other words more than it saved).
#[inline(never)]
fn other_word(bytes: &[u8], start: usize, f: &mut Counts) -> Option<(usize, bool)> {
    if let Some(word) =
        load8(bytes, start).and_then(|w| capitalised(bytes, start, w, f, true, false))
    {
        return Some(word);
    }
    let tail = word_tail(bytes, start);
    let i = if tail.letters == 0 {
        // A capital, or no letter at all.
        if !bytes.get(start).is_some_and(u8::is_ascii_uppercase) {
            return None;
        }
        scan_word(bytes, start, f, false)
    } else {
        count_read_word(bytes, f, start, 0, &tail, true, false, false)
    };
    Some((i, bytes.get(i) == Some(&b' ')))
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::super::weights::NUM_FEATURES;
    use super::*;

    /// Words from the corpus (Vietnamese, accented Latin, English) and random letters (ASCII,
    /// accented of two and three bytes, capitals, digits, other characters), for the tests below.
    fn word_maker() -> impl FnMut() -> String {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
        let mut words: Vec<String> = Vec::new();
        for name in ["vietnamese.jsonl", "latin.jsonl", "english.jsonl"] {
            let body = std::fs::read_to_string(dir.join(name)).unwrap();
            words.extend(
                body.split([' ', '"'])
                    .filter(|w| !w.is_empty())
                    .map(str::to_owned),
            );
        }
        let pieces: Vec<char> = "abcdefghijklmnopqrstuvwxyzàáâãäåæçèéêëìíîïñòóôõöøùúûüýÿāăąćčďđēęěğīıłńňōőœřśşšťūůűźżžơưạảấầẩẫậắằẳẵặẹẻẽếềểễệỉịọỏốồổỗộớờởỡợụủứừửữựỳỵỷỹAZÀÉĐ09.,'’-中ß"
            .chars()
            .collect();
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        move || {
            let mut next = |m: usize| (super::super::tests::xorshift(&mut x) % m as u64) as usize;
            let mut text = String::new();
            if next(2) == 0 {
                text.push_str(&words[next(words.len())]);
            } else {
                for _ in 0..1 + next(9) {
                    // Mostly lower-case letters, as words are.
                    let k = if next(3) == 0 {
                        next(pieces.len())
                    } else {
                        next(26)
                    };
                    text.push(pieces[k]);
                }
            }
            text.push_str([" ", ".", "", " và", "\n", ", "][next(6)]);
            text
        }
    }

    #[test]
    fn a_short_word_is_counted_as_the_general_path_counts_it() {
        // Wherever `short_word` takes a word (after a space or not, after punctuation or not; of up
        // to eight bytes and, by `long_word`, of up to fifteen), it
        // ends where `word_tail` + `count_read_word` (what `scan_words` did before it) end, counts
        // the same features and tells whether a space follows.
        let mut word = word_maker();
        let (mut taken, mut unknown, mut long, mut long_unknown, mut capital) = (0, 0, 0, 0, 0);
        for k in 0..40_000 {
            let (space, after_punct) = (k % 2 == 0, k % 3 == 0);
            let text = format!(" {}        ", word());
            let bytes = text.as_bytes();
            let (mut fast, mut plain) = ([0u64; NUM_FEATURES], [0u64; NUM_FEATURES]);
            let w = load8(bytes, 1).unwrap();
            let taken_by = match short_word(bytes, 1, &mut fast, space, after_punct, k % 5 == 0) {
                None => capitalised(bytes, 1, w, &mut fast, space, after_punct),
                word => word,
            };
            let Some((end, spaced)) = taken_by else {
                assert_eq!(
                    fast, [0u64; NUM_FEATURES],
                    "{text:?}: counted, then refused"
                );
                continue;
            };
            // `scan_word` with `space` given.
            let upper = capitals(bytes, 1);
            let tail = word_tail(bytes, 1 + upper);
            assert!(
                upper + tail.letters > 0,
                "{text:?}: taken, but no word there"
            );
            let want = count_read_word(
                bytes,
                &mut plain,
                1,
                upper,
                &tail,
                space,
                after_punct,
                false,
            );
            capital += usize::from(upper > 0);
            assert_eq!(end, want, "{text:?}");
            assert_eq!(fast, plain, "{text:?} {space} {after_punct}");
            assert_eq!(spaced, bytes.get(end) == Some(&b' '), "{text:?}");
            taken += 1;
            unknown += usize::from(!known(bytes, 1, end, space));
            long += usize::from(end > 9);
            long_unknown += usize::from(end > 9 && !known(bytes, 1, end, space));
        }
        // Both of its paths ran, for words of up to eight bytes and longer ones: words the table
        // knows and words it does not.
        assert!(
            taken > 10_000 && unknown > 2_000 && taken - unknown > 2_000,
            "{taken} taken, {unknown} unknown"
        );
        assert!(
            long > 2_000 && long_unknown > 500 && long - long_unknown > 200,
            "{long} long taken, {long_unknown} unknown"
        );
        assert!(capital > 1_000, "{capital} capitalised taken");
    }

    /// [`scan_words`] without [`short_word`]: [`scan_word`], then [`word_tail`] and
    /// [`count_read_word`] for each word after a single space (what it was before).
    fn scan_words_plain(bytes: &[u8], start: usize, f: &mut Counts, after_punct: bool) -> usize {
        let mut i = scan_word(bytes, start, f, after_punct);
        while bytes.get(i) == Some(&b' ') {
            let start = i + 1;
            let tail = word_tail(bytes, start);
            if tail.letters == 0 {
                if !bytes.get(start).is_some_and(u8::is_ascii_uppercase) {
                    break;
                }
                i = scan_word(bytes, start, f, false);
                continue;
            }
            i = count_read_word(bytes, f, start, 0, &tail, true, false, false);
        }
        i
    }

    #[test]
    fn scan_words_counts_as_its_plain_loop_counts() {
        // Runs of words (corpus words and random letters with punctuation, ends of the text at
        // every distance) from after a space or not, after punctuation or not: the same end and
        // the same features as the loop without `short_word`.
        let mut word = word_maker();
        for k in 0..20_000 {
            let mut text = String::from(["", " ", "(", "a"][k % 4]);
            let from = text.len();
            for _ in 0..1 + k % 7 {
                text.push_str(&word());
                if k % 5 != 0 {
                    text.push(' ');
                }
            }
            let bytes = text.as_bytes();
            // The first word starts with a letter, as where `scan_words` is called.
            let first = text[from..].chars().next().unwrap();
            if !first.is_alphabetic() || first.is_uppercase() || first == '中' {
                continue;
            }
            let after_punct = k % 3 == 0;
            let (mut fast, mut plain) = ([0u64; NUM_FEATURES], [0u64; NUM_FEATURES]);
            let end = scan_words(bytes, from, &mut fast, after_punct);
            let want = scan_words_plain(bytes, from, &mut plain, after_punct);
            assert_eq!(end, want, "{text:?}");
            assert_eq!(fast, plain, "{text:?}");
        }
    }

    #[test]
    fn ext_lead_says_what_latin_ext_at_says() {
        // Every character of two bytes and of three bytes in U+1000..=U+1FFF: `EXT_LEAD` at its
        // first two bytes is 0 where `latin_ext_at` finds no accented letter, else its continuation
        // bytes plus 16 for one of Latin Extended-A's feature.
        let mut letters = 0;
        for cp in (0x80..0x800).chain(0x1000..0x2000) {
            let Some(c) = char::from_u32(cp) else {
                continue;
            };
            let mut buf = [0u8; 8];
            let n = c.encode_utf8(&mut buf).len();
            let v = u64::from_le_bytes(buf);
            let kind = EXT_LEAD[(v & 0x3F3F) as usize];
            let want =
                latin_ext_at(&buf, 0).map_or(0, |(len, a)| (len - 1) as u8 | u8::from(a) << 4);
            assert_eq!(kind, want, "U+{cp:04X}");
            assert_eq!(want != 0, is_latin_ext(cp), "U+{cp:04X}");
            if want != 0 {
                assert_eq!(usize::from(want & 15), n - 1, "U+{cp:04X}");
                letters += 1;
            }
        }
        assert!(letters > 600, "{letters}");
    }
}
