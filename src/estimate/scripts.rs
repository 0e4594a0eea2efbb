//! Runs of non-ASCII text: one piece from a non-ASCII character, with tight loops for runs of
//! ideographs and kana, Hangul, Thai and the alphabetic scripts.

use super::bytes::{bump, Counts};
use super::classes::{
    alpha_run_feature, char_feature, classify, cp3, decode, han_feature, hangul_feature, plain_cp3,
    run_of, thai_feature, Cls, Run, THAI_FEATURE,
};
use super::latin::{is_latin_ext, scan_word, scan_words, space_before};
use super::pairs_table::{HIRA_PAIR, KATA_PAIR, THAI_END4, THAI_MID, THAI_PAIR, THAI_PREFIX};
use super::tables::{HANGUL_COUNT, HAN_COUNT};
use super::weights::feature;
use super::words::{
    greek_bit, greek_maybe, greek_step, known, known_run, load, GREEK_BACK, GREEK_BARE,
    GREEK_SPACED, MAX_WORD,
};

/// One piece that starts with the non-ASCII character at `i`; returns the index after it (> `i`), or
/// None if no UTF-8 character starts at `i`.
#[inline(always)]
pub(super) fn scan_non_ascii(
    bytes: &[u8],
    i: usize,
    f: &mut Counts,
    was_punct: bool,
) -> Option<usize> {
    // Letters of the alphabetic scripts (Cyrillic, Greek, Hebrew, Arabic, Indic) first: their tight
    // loop.
    if let Some(first) = alpha_at(bytes, i) {
        return Some(scan_alpha(bytes, i, first, f));
    }
    let (cp, n) = decode(bytes, i)?;
    // Accented Latin letters: a word (the common case of European and Vietnamese text).
    if is_latin_ext(cp) {
        return Some(scan_words(bytes, i, f, was_punct));
    }
    let j = i + n;
    // The scripts of long runs first, straight into their run loops.
    let han = cp.wrapping_sub(0x4E00);
    if han < HAN_COUNT {
        bump(f, feature::CJK_RUNS, 1);
        bump(f, han_feature(han), 1);
        return Some(scan_cjk(bytes, i, j, false, f));
    }
    let hangul = cp.wrapping_sub(0xAC00);
    if hangul < HANGUL_COUNT {
        bump(f, feature::HANGUL_RUNS, 1);
        bump(f, hangul_feature(hangul), 1);
        return Some(scan_hangul(bytes, j, f));
    }
    let thai = cp.wrapping_sub(0xE00);
    if thai < 0x80 {
        bump(f, feature::THAI_RUNS, 1);
        bump(f, thai_feature(thai), 1);
        let end = scan_thai(bytes, j, f);
        bump(f, feature::THAI_TOKENS, thai_tokens(bytes, i, end));
        return Some(end);
    }
    let cls = classify(cp);
    Some(match cls {
        Cls::LatinExt => scan_word(bytes, i, f, was_punct),
        // Unicode spaces, line separators, punctuation and digits: one piece each. A non-ASCII
        // space is never merged into a word by o200k: the typographic ones (U+2000–U+200A, U+205F)
        // are two tokens, no-break, narrow and ideographic spaces about one.
        Cls::Space => {
            // A run of the same space: o200k merges no-break and ideographic spaces (about 8 and
            // 16 to a token), not the typographic or narrow ones (two and one token each).
            let mut end = j;
            let mut run = 1u64;
            while let Some((next, m)) = decode(bytes, end) {
                if next != cp {
                    break;
                }
                end += m;
                run += 1;
            }
            if (0x2000..=0x200A).contains(&cp) || cp == 0x205F {
                bump(f, feature::SYMBOL, run);
            } else if cp == 0xA0 || cp == 0x3000 {
                bump(f, feature::PUNCT_RUNS, 1 + (run - 1) / 8);
            } else {
                bump(f, feature::PUNCT_RUNS, run);
            }
            end
        }
        Cls::Newline => {
            bump(f, feature::NEWLINE_RUNS, 1);
            j
        }
        Cls::Punct => {
            bump(f, feature::PUNCT, 1);
            bump(f, feature::PUNCT_RUNS, 1);
            j
        }
        Cls::Digit => {
            bump(f, feature::DIGIT_GROUPS, 1);
            j
        }
        Cls::ZeroWidth => {
            // A run of them is one piece; o200k merges a few into a token.
            let mut j = j;
            let mut n = 1u64;
            while let Some((cp, len)) = decode(bytes, j) {
                if classify(cp) != Cls::ZeroWidth {
                    break;
                }
                n += 1;
                j += len;
            }
            bump(f, feature::ZERO_WIDTH_RUNS, 1);
            bump(f, feature::ZERO_WIDTH, n);
            j
        }
        _ => {
            if let Some(idx) = char_feature(cls) {
                bump(f, idx, 1);
            }
            match run_of(cls) {
                Some(Run::Cjk) => {
                    bump(f, feature::CJK_RUNS, 1);
                    scan_cjk(bytes, i, j, cls == Cls::Katakana, f)
                }
                Some(Run::Hangul) => {
                    bump(f, feature::HANGUL_RUNS, 1);
                    scan_hangul(bytes, j, f)
                }
                Some(Run::Alpha) => {
                    bump(f, alpha_run_feature(cls), 1);
                    scan_run(bytes, j, Run::Alpha, f)
                }
                Some(Run::Thai) => {
                    bump(f, feature::THAI_RUNS, 1);
                    scan_run(bytes, j, Run::Thai, f)
                }
                None => j,
            }
        }
    })
}

/// Letters of the alphabetic runs that [`scan_alpha`] reads in its tight loop, by their class there
/// (an index into [`ALPHA_LETTER`] and [`ALPHA_RUN`]).
const A_CYRILLIC: u8 = 0;
const A_CYRILLIC_UK: u8 = 1;
const A_GREEK: u8 = 2;
const A_ARABIC: u8 = 3;
const A_HEBREW: u8 = 4;
const A_INDIC: u8 = 5;
/// Not such a letter.
const A_NONE: u8 = 0xFF;
/// Per-letter feature of each class.
const ALPHA_LETTER: [usize; 6] = [
    feature::CYRILLIC,
    feature::CYRILLIC_UK,
    feature::GREEK,
    feature::ARABIC,
    feature::HEBREW,
    feature::INDIC,
];
/// Run feature of a run that starts with a letter of each class (see `alpha_run_feature`).
const ALPHA_RUN: [usize; 6] = [
    feature::ALPHA_RUNS,
    feature::ALPHA_RUNS,
    feature::GREEK_RUNS,
    feature::ARABIC_RUNS,
    feature::HEBREW_RUNS,
    feature::INDIC_RUNS,
];

/// First two-byte code point in [`ALPHA2`].
const ALPHA2_FROM: u32 = 0x340;

/// The class in [`scan_alpha`] of a two-byte code point (U+0340..=U+07FF): what `classify` says,
/// for the letters of alphabetic runs (the tests compare the two).
const fn alpha2_class(cp: u32) -> u8 {
    match cp {
        0x370..=0x3FF => A_GREEK,
        0x404 | 0x406 | 0x407 | 0x454 | 0x456 | 0x457 | 0x490 | 0x491 => A_CYRILLIC_UK,
        0x400..=0x52F => A_CYRILLIC,
        0x590..=0x5FF => A_HEBREW,
        0x600..=0x6FF | 0x750..=0x77F => A_ARABIC,
        _ => A_NONE,
    }
}

/// [`alpha2_class`] of U+0340..=U+07FF.
pub(super) static ALPHA2: [u8; (0x800 - ALPHA2_FROM) as usize] = {
    let mut t = [A_NONE; (0x800 - ALPHA2_FROM) as usize];
    let mut i = 0;
    while i < t.len() {
        #[allow(clippy::indexing_slicing)] // compile time: out of range fails the build
        {
            t[i] = alpha2_class(ALPHA2_FROM + i as u32);
        }
        i += 1;
    }
    t
};

/// The letter at `j` if it is one of [`scan_alpha`]'s tight loop (a two-byte letter of Cyrillic,
/// Greek, Hebrew or Arabic, or a three-byte one of U+0900..=U+0DFF, Indic): its class and length.
#[inline(always)]
pub(super) fn alpha_at(bytes: &[u8], j: usize) -> Option<(u8, usize)> {
    match *bytes.get(j..)? {
        [b0 @ 0xCD..=0xDF, b1 @ 0x80..=0xBF, ..] => {
            let cp = (u32::from(b0 & 0x1F) << 6) | u32::from(b1 & 0x3F);
            let k = ALPHA2
                .get(cp.wrapping_sub(ALPHA2_FROM) as usize)
                .copied()
                .unwrap_or(A_NONE);
            (k != A_NONE).then_some((k, 2))
        }
        [0xE0, 0xA4..=0xB7, 0x80..=0xBF, ..] => Some((A_INDIC, 3)),
        _ => None,
    }
}

/// A 64-bit word of four 16-bit lanes `lane`.
const fn lanes(lane: u64) -> u64 {
    lane * 0x0001_0001_0001_0001
}

/// The four-letter step of [`scan_alpha`] for a run of each class: a two-byte letter read as a
/// little-endian 16-bit lane (lead byte low, continuation byte high) is of the class where
/// `lane & mask == value`, with lead bytes whose 64 code points are all of it (Cyrillic D0–D1 but
/// for the letters of [`A_CYRILLIC_UK`], see [`uk_suspects`]; Greek CE–CF; Arabic D8–DB; Hebrew
/// D7). The other letters of a class (Greek U+0370..=U+037F, Hebrew points, …) and the classes
/// without a step (mask 0, value 1: no lane matches) go a letter at a time.
const ALPHA_LANES: [(u64, u64); 6] = [
    (lanes(0xC0FE), lanes(0x80D0)),
    (0, 1),
    (lanes(0xC0FE), lanes(0x80CE)),
    (lanes(0xC0FC), lanes(0x80D8)),
    (lanes(0xC0FF), lanes(0x80D7)),
    (0, 1),
];

/// [`ALPHA_LANES`] of `class`.
#[inline(always)]
fn alpha_lanes(class: usize) -> (u64, u64) {
    ALPHA_LANES.get(class).copied().unwrap_or((0, 1))
}

/// Lanes of `w` (as in [`ALPHA_LANES`]) that may be a letter of [`A_CYRILLIC_UK`] if their lead
/// byte is D0 or D1: bit 6 of the lane set where the continuation byte, with bit 4 flipped after
/// D1, is 84..=87 (D0 84, 86, 87 and D1 94, 96, 97 are those letters; D0 85 and D1 95, Ѕ and ѕ,
/// only go the slow way).
#[inline(always)]
fn uk_suspects(w: u64) -> u64 {
    let u = w ^ ((w & lanes(1)) << 12);
    // The continuation byte's top six bits, 0x21 for 84..=87, then a lane that is not 0x21 sets
    // bit 6 (at most 63 + 63: no carry into the next lane).
    let y = ((u >> 10) & lanes(0x3F)) ^ lanes(0x21);
    ((y + lanes(0x3F)) & lanes(0x40)) ^ lanes(0x40)
}

/// A run of an alphabetic script from the letter at `i` (`first`: its [`alpha_at`]), and the runs
/// after it that only single spaces separate (a single space between words has no feature of its
/// own, see `count_features`); returns the index after the last. Counts what `scan_run` and the
/// byte-wise loop would, with the common letters four at a time ([`ALPHA_LANES`]) and their
/// counts kept in registers, except that a run of two letters or more that the word table knows
/// (see `words.rs`) is counted as one known word instead of by its letters.
#[inline(never)]
fn scan_alpha(bytes: &[u8], i: usize, first: (u8, usize), f: &mut Counts) -> usize {
    let mut letters_of = [0u64; 6];
    let mut runs_of = [0u64; 6];
    let mut long = 0u64;
    // Known runs, and those after a space.
    let (mut known_runs, mut known_space) = (0u64, 0u64);
    // The run being read: where it starts, whether a space comes before it, its class and its
    // four-letter step, its letters so far.
    let mut from = i;
    let mut space = space_before(bytes, i);
    let mut class = usize::from(first.0);
    let (mut mask, mut value) = alpha_lanes(class);
    let mut letters = 1u64;
    // `letters_of` before the first letter of the run being read that is not of its class (set
    // then: put back if the table knows the run).
    let mut before = letters_of;
    // The letters of the run's class at `j`, four at most (see `ALPHA_LANES`).
    let step = |j: usize, mask: u64, value: u64, cyrillic: bool| -> usize {
        let Some(chunk) = bytes.get(j..j + 8).filter(|_| mask != 0) else {
            return 0;
        };
        let w = u64::from_le_bytes(<[u8; 8]>::try_from(chunk).unwrap_or([0; 8]));
        let mut bad = (w & mask) ^ value;
        if cyrillic {
            bad |= uk_suspects(w);
        }
        (bad.trailing_zeros() / 16) as usize
    };
    // `j` ≤ `bytes.len()` throughout, so the sums cannot overflow.
    let mut j = i + first.1;
    loop {
        let cyrillic = class == usize::from(A_CYRILLIC);
        // Letters of the run not of its class (counted as they come, into `letters_of` or `f`).
        let mut other = 0u64;
        // All its letters are of the tight loop (the others are counted straight into `f`).
        let mut plain = true;
        loop {
            // Four letters of the class at a time: the lanes before the first that is not one
            // (not for the classes without the step, Indic among them).
            loop {
                let k = step(j, mask, value, cyrillic);
                letters += k as u64;
                j += 2 * k;
                if k < 4 {
                    break;
                }
            }
            // The run ends at ASCII (as a rule: `alpha_at` and `decode` read none).
            if bytes.get(j).is_none_or(|&b| b < 0x80) {
                break;
            }
            if let Some((k, n)) = alpha_at(bytes, j) {
                if usize::from(k) != class {
                    if other == 0 {
                        before = letters_of;
                    }
                    if let Some(l) = letters_of.get_mut(usize::from(k)) {
                        *l += 1;
                    }
                    other += 1;
                }
                letters += 1;
                j += n;
                continue;
            }
            // Other letters of alphabetic runs (Greek Extended, Arabic presentation forms, …).
            match decode(bytes, j) {
                Some((cp, n)) if run_of(classify(cp)) == Some(Run::Alpha) => {
                    if let Some(idx) = char_feature(classify(cp)) {
                        bump(f, idx, 1);
                    }
                    letters += 1;
                    other += 1;
                    plain = false;
                    j += n;
                }
                _ => break,
            }
        }
        // A Greek word of two-byte letters only (not one of Greek Extended), asked for only
        // where the table does not know the run.
        let greek = || {
            class == usize::from(A_GREEK)
                && letters >= GREEK_PIECES_MIN
                && plain
                && (j - from) as u64 == 2 * letters
        };
        if plain && letters >= 2 && known_run(bytes, from, j, space) {
            if other != 0 {
                letters_of = before;
            }
            known_runs += 1;
            known_space += u64::from(space);
        } else if let Some(n) = greek()
            .then(|| greek_pieces(bytes, from, j, space))
            .flatten()
        {
            if other != 0 {
                letters_of = before;
            }
            bump(f, feature::GREEK_TWO_PIECES + usize::from(n == 3), 1);
        } else {
            if let Some(l) = letters_of.get_mut(class) {
                *l += letters - other;
            }
            if let Some(r) = runs_of.get_mut(class) {
                *r += 1;
            }
            long += letters.saturating_sub(ALPHA_WORD);
        }
        // A single space and another letter: the next run, of the same class (its first letters
        // by the step) or not.
        if bytes.get(j) == Some(&b' ') {
            space = true;
            from = j + 1;
            let k = step(from, mask, value, cyrillic);
            if k > 0 {
                letters = k as u64;
                j = from + 2 * k;
                continue;
            }
            if let Some((k, n)) = alpha_at(bytes, from) {
                class = usize::from(k);
                (mask, value) = alpha_lanes(class);
                letters = 1;
                j = from + n;
                continue;
            }
        }
        break;
    }
    bump(f, feature::ALPHA_LONG, long);
    for ((n, r), (&fl, &fr)) in letters_of
        .iter()
        .zip(&runs_of)
        .zip(ALPHA_LETTER.iter().zip(&ALPHA_RUN))
    {
        bump(f, fl, *n);
        bump(f, fr, *r);
    }
    bump(f, feature::ALPHA_KNOWN, known_space);
    bump(f, feature::ALPHA_KNOWN_BARE, known_runs - known_space);
    j
}

/// Fewest letters of a Greek word that [`scan_alpha`] reads for pieces (shorter ones cost about two
/// tokens by their letters anyway).
const GREEK_PIECES_MIN: u64 = 6;
/// Most letters of a Greek word read for pieces.
const GREEK_PIECES_MAX: usize = 24;
/// Most letters of a first piece (12 of o200k's 632 Greek words after a space are longer) and of
/// a piece without a space (o200k's longest).
const GREEK_FIRST_MAX: usize = 8;
const GREEK_BARE_MAX: usize = 8;
/// Prefixes that every word asked for has (`GREEK_PIECES_MIN` − 1).
const GREEK_SURE_FIRSTS: usize = GREEK_PIECES_MIN as usize - 1;

/// The codes of four Greek letters from their eight bytes (`w`, little-endian): a letter's code
/// point − U+0370 + 1 (1..=144) in the low byte of its 16-bit lane, the high byte 0. For a two-byte
/// letter `(b0 << 6) + b1` is its code point + 0x3080 (the bytes' marker bits); no lane carries
/// into the next, and a lane past the word's end (its code is not read) borrows only from those
/// above it.
#[inline(always)]
fn pair_codes(w: u64) -> u64 {
    let lead = w & lanes(0xFF);
    let cont = (w >> 8) & lanes(0xFF);
    ((lead << 6) + cont).wrapping_sub(lanes(0x3080 + 0x36F))
}

/// The code ([`pair_codes`]) in the low byte of a lane.
#[inline(always)]
fn lane_code(lane: &[u8]) -> u64 {
    u64::from(lane.first().copied().unwrap_or(0))
}

/// The Greek word `bytes[from..to]` (two-byte letters only, after a space if `space`) as o200k
/// tokens, where the word table does not know it: Some(2) if it is a word of the table followed by
/// one without a space (`εμφαν` + `ίζεται`), Some(3) if by two, else None. On the Greek words of
/// the corpus o200k splits exactly so where it can (the single-token words of the table cannot
/// tell). One pass forwards and one backwards over the letters ask [`greek_maybe`] for every
/// prefix and suffix (the backward one from the end down to the first prefix found); middle pieces
/// only between candidates. None for a word of fewer than [`GREEK_PIECES_MIN`] letters.
#[inline(never)]
fn greek_pieces(bytes: &[u8], from: usize, to: usize, space: bool) -> Option<u8> {
    let n = (to - from) / 2;
    // `scan_alpha` asks for words of `GREEK_PIECES_MIN` letters or more only.
    if !(GREEK_PIECES_MIN as usize..=GREEK_PIECES_MAX).contains(&n) {
        return None;
    }
    // Bit `k` (1..n): the first `k` letters may be a word of the table; the letters from the `k`th
    // on may be one without a space.
    // The letters' codes, computed once for the three passes: letter `k`'s in the low byte of
    // the 16-bit lane at `2 * k`.
    let mut codes = [0u8; 2 * GREEK_PIECES_MAX];
    for (k, out) in codes.chunks_exact_mut(8).enumerate().take(n.div_ceil(4)) {
        out.copy_from_slice(&pair_codes(load(bytes, from + 8 * k)).to_le_bytes());
    }
    let word = codes.get(..2 * n)?;
    let (mut pre, mut suf) = (0u32, 0u32);
    let mut h = if space { GREEK_SPACED } else { GREEK_BARE };
    let firsts = (n - 1).min(GREEK_FIRST_MAX);
    // Each answer into bit 31, the earlier ones a bit down: the `k`th at `31 - firsts + k`. The
    // first `GREEK_SURE_FIRSTS` prefixes (every word asked for has them) without the loop's count.
    // Letter `k`'s code (`k` < `n` ≤ `GREEK_PIECES_MAX`: within `codes`).
    let code = |k: usize| u64::from(codes.get(2 * k).copied().unwrap_or(0));
    let forward = |h: &mut u64, pre: &mut u32, code: u64| {
        *h = greek_step(*h, code);
        *pre = (*pre >> 1) | ((greek_bit(*h) as u32) << 31);
    };
    if let Some(sure) = codes.first_chunk::<{ 2 * GREEK_SURE_FIRSTS }>() {
        for pair in sure.chunks_exact(2) {
            forward(&mut h, &mut pre, lane_code(pair));
        }
    }
    for k in GREEK_SURE_FIRSTS..firsts {
        forward(&mut h, &mut pre, code(k));
    }
    pre >>= 31 - firsts;
    if pre == 0 {
        return None;
    }
    // A suffix from `k` is of use if `k` is a prefix's end (two pieces) or after one (three).
    let lowest = n
        .saturating_sub(GREEK_BARE_MAX)
        .max(pre.trailing_zeros() as usize);
    // Each answer shifted in without a branch (the first, the suffix of the last letter, ends
    // at bit `n - 1 - lowest`), then moved up to its letter.
    let mut g = GREEK_BACK;
    for k in (lowest..n).rev() {
        g = greek_step(g, code(k));
        suf = (suf << 1) | (greek_bit(g) as u32 & 1);
    }
    suf <<= lowest;
    if pre & suf != 0 {
        return Some(2);
    }
    greek_middle(word, pre, suf)
}

/// [`greek_pieces`]' last pass: `Some(3)` if a middle piece without a space joins a prefix's end
/// (a bit of `pre`) to a suffix's start (a bit of `suf`), else None. `word`: the letters' codes.
#[inline(always)]
fn greek_middle(word: &[u8], pre: u32, suf: u32) -> Option<u8> {
    let mut first = pre;
    while first != 0 {
        let a = first.trailing_zeros() as usize;
        first &= first - 1;
        // The middle piece's hash, from letter `a` up to each candidate end `b` (a suffix's start,
        // `a` < `b` ≤ `a + GREEK_BARE_MAX`), a letter at a time: bit 0 of `ends` is the letter
        // just hashed.
        let mut ends = (suf >> a) >> 1 & ((1 << GREEK_BARE_MAX) - 1);
        let mut m = GREEK_BARE;
        for pair in word.get(2 * a..).unwrap_or(&[]).chunks_exact(2) {
            if ends == 0 {
                break;
            }
            m = greek_step(m, lane_code(pair));
            if ends & 1 != 0 && greek_maybe(m) {
                return Some(3);
            }
            ends >>= 1;
        }
    }
    None
}

/// Rest of a run of kana and ideographs from `j` (the first character, at `i`, is counted); returns
/// the index after the run. `kata`: the first character is katakana. A run of katakana (two
/// characters or more, a loanword as a rule) that the word table knows counts as one known word
/// instead of by its characters.
#[inline(never)]
pub(super) fn scan_cjk(bytes: &[u8], i: usize, mut j: usize, kata: bool, f: &mut Counts) -> usize {
    let mut prev_kata = kata;
    let mut kata_runs = u64::from(kata);
    // Where the katakana run being read starts (`usize::MAX` when it started outside the kana
    // loop: not looked up).
    let mut kata_from = if kata { i } else { usize::MAX };
    let (mut hiragana, mut katakana) = (0u64, 0u64);
    // Kana pairs that are a token, and their count where the katakana run being read starts; the
    // last kana (where, its code, whether it ended a pair), from the first character if it is one.
    let (mut pairs, mut pairs_from) = (0u64, 0u64);
    let (mut last_kana, mut last_code) = match bytes.get(i..) {
        Some(&[0xE3, b1 @ 0x81..=0x83, b2 @ 0x80..=0xBF, ..]) => {
            let cp = cp3(0xE3, b1, b2);
            (
                i,
                cp.wrapping_sub(if kata { 0x30A0 } else { 0x3040 }) as usize,
            )
        }
        _ => (usize::MAX - 3, 0usize),
    };
    let mut last_paired = false;
    // A katakana run `from..to` the table knows counts as one word: its characters, its run and its
    // pairs (`pairs_in`) are taken back.
    let end_kata = |from: usize, to: usize, pairs_in: u64, acc: &mut [u64; 3]| {
        // 2..=10 characters (3 bytes each).
        if from < to
            && (6..=MAX_WORD).contains(&(to - from))
            && known(bytes, from, to, space_before(bytes, from))
        {
            acc[0] += 1;
            acc[1] += ((to - from) / 3) as u64;
            acc[2] += pairs_in;
        }
    };
    // Known katakana runs, their characters and their pairs.
    let mut acc = [0u64; 3];
    loop {
        let start = j;
        // Consecutive ideographs (U+4E00..=U+9FFF is E4 B8 80..=E9 BF BF), the bulk of Chinese.
        while let Some(&[b0 @ 0xE4..=0xE9, b1 @ 0x80..=0xBF, b2 @ 0x80..=0xBF, ..]) = bytes.get(j..)
        {
            let h = cp3(b0, b1, b2).wrapping_sub(0x4E00);
            if h >= HAN_COUNT {
                break;
            }
            bump(f, han_feature(h), 1);
            j += 3;
        }
        if j != start {
            if prev_kata {
                end_kata(kata_from, start, pairs - pairs_from, &mut acc);
            }
            prev_kata = false;
        }
        // Consecutive kana (U+3040..=U+30FF is E3 81 80..=E3 83 BF; katakana from U+30A0).
        while let Some(&[0xE3, b1 @ 0x81..=0x83, b2 @ 0x80..=0xBF, ..]) = bytes.get(j..) {
            let cp = cp3(0xE3, b1, b2);
            let kata = cp >= 0x30A0;
            katakana += u64::from(kata);
            hiragana += u64::from(!kata);
            // Pairs of kana of one kind that are a token, taken greedily from the left (a pair
            // cannot take the second character of the pair before it).
            let code = cp.wrapping_sub(if kata { 0x30A0 } else { 0x3040 }) as usize;
            let bits = if kata { &KATA_PAIR } else { &HIRA_PAIR };
            let paired = j == last_kana + 3
                && kata == prev_kata
                && !last_paired
                && kana_pair(bits, last_code, code);
            pairs += u64::from(paired);
            last_paired = paired;
            last_code = code;
            last_kana = j;
            if kata != prev_kata {
                if kata {
                    kata_runs += 1;
                    kata_from = j;
                    pairs_from = pairs;
                } else {
                    end_kata(kata_from, j, pairs - pairs_from, &mut acc);
                }
            }
            prev_kata = kata;
            j += 3;
        }
        if j != start {
            continue;
        }
        // Anything else by `decode` and `classify`.
        let Some((cp, n)) = decode(bytes, j) else {
            break;
        };
        let c = classify(cp);
        if run_of(c) != Some(Run::Cjk) {
            break;
        }
        bump(f, char_feature(c).unwrap_or(feature::OTHER), 1);
        let kata = c == Cls::Katakana;
        if prev_kata {
            end_kata(kata_from, j, pairs - pairs_from, &mut acc);
        }
        kata_runs += u64::from(kata && !prev_kata);
        kata_from = usize::MAX;
        prev_kata = kata;
        j += n;
    }
    if prev_kata {
        end_kata(kata_from, j, pairs - pairs_from, &mut acc);
    }
    bump(f, feature::HIRAGANA, hiragana);
    bump(f, feature::KATAKANA, katakana);
    bump(f, feature::KATAKANA_RUNS, kata_runs);
    // Known runs count as such, not by their characters (the first one may have been counted
    // before this function).
    let [known_runs, known_chars, known_pairs] = acc;
    for (idx, n) in [
        (feature::KATAKANA, known_chars),
        (feature::KATAKANA_RUNS, known_runs),
    ] {
        if let Some(c) = f.get_mut(idx) {
            *c = c.saturating_sub(n);
        }
    }
    bump(f, feature::KATA_KNOWN, known_runs);
    bump(f, feature::KANA_PAIRS, pairs.saturating_sub(known_pairs));
    j
}

/// Whether the pair of kana codes `a`, `b` (0..96 from U+3040 or U+30A0) is set in `bits`.
#[inline(always)]
fn kana_pair(bits: &[u64; 144], a: usize, b: usize) -> bool {
    let k = a * 96 + b;
    a < 96 && b < 96 && bits.get(k / 64).is_some_and(|w| (w >> (k % 64)) & 1 != 0)
}

/// Rest of a run of Hangul from `j` (the first character is counted); returns the index after it.
#[inline(never)]
pub(super) fn scan_hangul(bytes: &[u8], mut j: usize, f: &mut Counts) -> usize {
    let mut runs = 0u64;
    loop {
        let (cp, n) = match plain_cp3(bytes, j) {
            Some(cp) => (cp, 3),
            None => {
                // One space and another syllable: that space has no feature of its own (see
                // `count_features`), and the next run is counted here.
                if bytes.get(j) == Some(&b' ') {
                    let h =
                        plain_cp3(bytes, j + 1).map_or(HANGUL_COUNT, |cp| cp.wrapping_sub(0xAC00));
                    if h < HANGUL_COUNT {
                        runs += 1;
                        bump(f, hangul_feature(h), 1);
                        j += 4;
                        continue;
                    }
                }
                match decode(bytes, j) {
                    Some(c) => c,
                    None => break,
                }
            }
        };
        let h = cp.wrapping_sub(0xAC00);
        if h < HANGUL_COUNT {
            bump(f, hangul_feature(h), 1);
        } else {
            let c = classify(cp);
            if run_of(c) != Some(Run::Hangul) {
                break;
            }
            bump(f, char_feature(c).unwrap_or(feature::OTHER), 1);
        }
        j += n;
    }
    bump(f, feature::HANGUL_RUNS, runs);
    j
}

/// Bits of a Thai feature count packed in [`scan_thai`]'s accumulator (three counts of 21 bits).
const THAI_FIELD: u32 = 21;

/// What one Thai character (its code from U+0E00) adds to [`scan_thai`]'s accumulator: one in the
/// field of its feature ([`feature::THAI_COMMON`], [`feature::THAI`], [`feature::THAI_RARE`]).
#[allow(clippy::indexing_slicing)] // compile time: out of range fails the build
static THAI_INC: [u64; 0x80] = {
    let mut t = [0u64; 0x80];
    let mut i = 0;
    while i < 0x80 {
        let f = THAI_FEATURE[i] as usize;
        let field = if f == feature::THAI_COMMON {
            0
        } else if f == feature::THAI {
            1
        } else {
            2
        };
        t[i] = 1 << (field * THAI_FIELD);
        i += 1;
    }
    t
};

/// Thai characters [`scan_thai`] reads at most before it adds its accumulator to the counts (so
/// that no 21-bit field can wrap: fewer than two such chunks and one character are added up
/// between two flushes, < 2^20 + 1).
const THAI_CHUNK: usize = 1 << 19;

/// Adds the packed counts of [`scan_thai`]'s accumulator `acc` to `f`.
#[inline(always)]
fn thai_flush(f: &mut Counts, acc: u64) {
    let mask = (1u64 << THAI_FIELD) - 1;
    bump(f, feature::THAI_COMMON, acc & mask);
    bump(f, feature::THAI, (acc >> THAI_FIELD) & mask);
    bump(f, feature::THAI_RARE, acc >> (2 * THAI_FIELD));
}

/// Rest of a run of Thai from `j` (the first character is counted); returns the index after it.
#[inline(never)]
pub(super) fn scan_thai(bytes: &[u8], mut j: usize, f: &mut Counts) -> usize {
    let mut runs = 0u64;
    // The characters' features are counted in the fields of `acc` (see `THAI_INC`), added to `f`
    // at the end and after about `THAI_CHUNK` characters: no read-modify-write of `f` a character.
    let mut acc = 0u64;
    let mut flushed = j;
    let inc = |b1: u8, b2: u8| {
        let code = (usize::from(b1 & 1) << 6) | usize::from(b2 & 0x3F);
        THAI_INC.get(code).copied().unwrap_or(0)
    };
    // U+0E00..=U+0E7F is E0 B8 80..=E0 B9 BF; nothing else is in a Thai run.
    loop {
        // At most `THAI_CHUNK` characters from `j`.
        let head = bytes
            .get(..j.saturating_add(3 * THAI_CHUNK))
            .unwrap_or(bytes);
        // Two characters at a time: E0 B8|B9 80..BF twice in the low six bytes of eight.
        while let Some(&eight) = head.get(j..).and_then(|t| t.first_chunk::<8>()) {
            let x = u64::from_le_bytes(eight);
            if x & 0xC0FE_FFC0_FEFF != 0x80B8_E080_B8E0 {
                break;
            }
            acc += inc((x >> 8) as u8, (x >> 16) as u8) + inc((x >> 32) as u8, (x >> 40) as u8);
            j += 6;
        }
        while let Some(&[0xE0, b1 @ 0xB8..=0xB9, b2 @ 0x80..=0xBF, ..]) = head.get(j..) {
            acc += inc(b1, b2);
            j += 3;
        }
        if j - flushed >= 3 * THAI_CHUNK {
            thai_flush(f, acc);
            acc = 0;
            flushed = j;
            if head.len() < bytes.len() {
                // The chunk ended, maybe not the run.
                continue;
            }
        }
        // One space and another Thai character: as in `scan_hangul`.
        match bytes.get(j..j + 4) {
            Some(&[b' ', 0xE0, b1 @ 0xB8..=0xB9, b2 @ 0x80..=0xBF]) => {
                runs += 1;
                acc += inc(b1, b2);
                j += 4;
            }
            _ => break,
        }
    }
    thai_flush(f, acc);
    bump(f, feature::THAI_RUNS, runs);
    j
}

/// [`THAI_FLAGS`] bit: the pair is an o200k token ([`THAI_PAIR`]).
const PAIR: u8 = 1;
/// [`THAI_FLAGS`] bit: the pair begins a Thai word of the table ([`THAI_PREFIX`]).
const PREFIX: u8 = 2;
/// [`THAI_FLAGS`] bit: the pair is the second and third characters of one ([`THAI_MID`]).
const MID: u8 = 4;
/// [`THAI_FLAGS`] bit: the pair ends a four-character one ([`THAI_END4`]).
const END4: u8 = 8;

/// The four Thai pair bitmaps in one byte a pair of codes `a`, `b` (index `128 a + b`, codes 96 and
/// up in none), so that one load answers all four.
#[allow(clippy::indexing_slicing)] // compile time: out of range fails the build
static THAI_FLAGS: [u8; 0x80 * 0x80] = {
    const CODES: usize = 96;
    let mut t = [0u8; 0x80 * 0x80];
    let mut a = 0;
    while a < CODES {
        let mut b = 0;
        while b < CODES {
            let k = a * CODES + b;
            t[a * 0x80 + b] = (thai_bit(&THAI_PAIR, k) * PAIR)
                | (thai_bit(&THAI_PREFIX, k) * PREFIX)
                | (thai_bit(&THAI_MID, k) * MID)
                | (thai_bit(&THAI_END4, k) * END4);
            b += 1;
        }
        a += 1;
    }
    t
};

/// Bit `k` of a Thai pair bitmap, at compile time.
#[allow(clippy::indexing_slicing)] // compile time: out of range fails the build
const fn thai_bit(bits: &[u64; 144], k: usize) -> u8 {
    ((bits[k / 64] >> (k % 64)) & 1) as u8
}

/// [`thai_tokens`]' code of a space (its low seven bits are a code in no pair of [`THAI_FLAGS`]).
const THAI_SPACE: u32 = 0x17F;
/// [`thai_tokens`]' code past the end of the run.
const THAI_END: u32 = 0x27F;

/// [`feature::THAI_TOKENS`] of the Thai run `bytes[from..to]` (Thai characters and single spaces):
/// o200k tokens by greedy longest match over the Thai words of the word table (four or three
/// characters, looked up only where their pairs of characters can be those of a word: see
/// [`THAI_PREFIX`], [`THAI_MID`], [`THAI_END4`]) and the Thai pairs that are tokens, one
/// character otherwise; a space ends a match. BPE is not greedy, but on Thai the count is within a
/// few percent of o200k's (the run's pre-tokenizer pieces are long, its tokens short).
#[inline(never)]
pub(super) fn thai_tokens(bytes: &[u8], from: usize, to: usize) -> u64 {
    let run = bytes.get(from..to).unwrap_or(&[]);
    // The run holds only Thai characters (E0 B8 80..=E0 B9 BF) and spaces: a lead byte E0 is one.
    // The code at `k` and the index after it.
    let read = |k: usize| match run.get(k..k + 3) {
        Some(&[0xE0, b1, b2]) => ((u32::from(b1 & 1) << 6) | u32::from(b2 & 0x3F), k + 3),
        _ if k < run.len() => (THAI_SPACE, k + 1),
        _ => (THAI_END, k),
    };
    let flags = |a: u32, b: u32| {
        THAI_FLAGS
            .get((((a & 0x7F) << 7) | (b & 0x7F)) as usize)
            .copied()
            .unwrap_or(0)
    };
    // A window of the next four codes, each read once: `w0` at `pos`, `w3` ending at `rd`.
    let (mut w0, k) = read(0);
    let (mut w1, k) = read(k);
    let (mut w2, k) = read(k);
    let (mut w3, mut rd) = read(k);
    let mut pos = 0;
    let mut n = 0u64;
    // Moves the window on by one to four codes.
    macro_rules! shift {
        (1) => {
            (w0, w1, w2) = (w1, w2, w3);
            (w3, rd) = read(rd);
        };
        (2) => {
            (w0, w1) = (w2, w3);
            (w2, rd) = read(rd);
            (w3, rd) = read(rd);
        };
        (3) => {
            w0 = w3;
            (w1, rd) = read(rd);
            (w2, rd) = read(rd);
            (w3, rd) = read(rd);
        };
        (4) => {
            (w0, rd) = read(rd);
            (w1, rd) = read(rd);
            (w2, rd) = read(rd);
            (w3, rd) = read(rd);
        };
    }
    // `pos` ≤ `rd` ≤ `run.len()`: the sums cannot overflow.
    while w0 != THAI_END {
        if w0 == THAI_SPACE {
            // A space between two Thai characters.
            pos += 1;
            shift!(1);
            continue;
        }
        n += 1;
        // A space or the end has no flags: the pair, the word's middle or its end is not there.
        let ab = flags(w0, w1);
        if ab & PREFIX != 0 && flags(w1, w2) & MID != 0 {
            let w = from + pos;
            if flags(w2, w3) & END4 != 0 && known(bytes, w, w + 12, false) {
                pos += 12;
                shift!(4);
                continue;
            }
            if known(bytes, w, w + 9, false) {
                pos += 9;
                shift!(3);
                continue;
            }
        }
        if ab & PAIR != 0 {
            pos += 6;
            shift!(2);
        } else {
            pos += 3;
            shift!(1);
        }
    }
    n
}

/// Letters of an alphabetic run up to which it costs like a word (see [`feature::ALPHA_LONG`]).
pub(super) const ALPHA_WORD: u64 = 12;

/// Rest of a run of `run` from `j` (the first character is counted), the general case.
#[inline(always)]
pub(super) fn scan_run(bytes: &[u8], mut j: usize, run: Run, f: &mut Counts) -> usize {
    let mut letters = 1u64;
    // ASCII never belongs to a script run: `decode` stops there.
    while let Some((cp, n)) = decode(bytes, j) {
        let c = classify(cp);
        if run_of(c) != Some(run) {
            break;
        }
        if let Some(idx) = char_feature(c) {
            bump(f, idx, 1);
        }
        letters += 1;
        j += n;
    }
    if run == Run::Alpha {
        bump(f, feature::ALPHA_LONG, letters.saturating_sub(ALPHA_WORD));
    }
    j
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::super::text::text_features;
    use super::*;

    /// Letters of `class` that [`scan_alpha`]'s four-letter step takes at the start of `w`.
    fn step(class: u8, w: u64) -> usize {
        let (mask, value) = ALPHA_LANES[usize::from(class)];
        let mut bad = (w & mask) ^ value;
        if class == A_CYRILLIC {
            bad |= uk_suspects(w);
        }
        (bad.trailing_zeros() / 16) as usize
    }

    #[test]
    fn the_four_letter_step_takes_only_letters_of_the_class() {
        // Every two-byte character in every lane, among three letters the step takes: taken
        // (and the lanes before it) only if `alpha_at` says it is of the class.
        let fill = [
            (A_CYRILLIC, 'д'),
            (A_GREEK, 'λ'),
            (A_ARABIC, 'م'),
            (A_HEBREW, 'ש'),
        ];
        let mut taken = [0usize; 4];
        for (n, &(class, letter)) in fill.iter().enumerate() {
            let mut lane = [0u8; 2];
            letter.encode_utf8(&mut lane);
            let base = lanes(u64::from(u16::from_le_bytes(lane)));
            assert_eq!(step(class, base), 4, "{letter}");
            for cp in 0x80u32..0x800 {
                let mut b = [0u8; 2];
                char::from_u32(cp).unwrap().encode_utf8(&mut b);
                let of_class = alpha_at(&b, 0) == Some((class, 2));
                for at in 0..4 {
                    let w = (base & !(0xFFFF << (16 * at)))
                        | (u64::from(u16::from_le_bytes(b)) << (16 * at));
                    let k = step(class, w);
                    if of_class && k == 4 {
                        taken[n] += 1;
                    } else {
                        assert_eq!(k, at, "U+{cp:04X} in lane {at}");
                    }
                }
            }
        }
        // Cyrillic D0–D1 but for six Ukrainian letters and Ѕ ѕ, Greek CE–CF, Arabic D8–DB,
        // Hebrew D7: in four lanes each.
        assert_eq!(taken, [4 * (128 - 8), 4 * 128, 4 * 256, 4 * 64]);
        // A run of no class with the step takes nothing.
        assert_eq!(step(A_CYRILLIC_UK, lanes(0x96D1)), 0);
        assert_eq!(step(A_INDIC, 0), 0);
    }

    #[test]
    fn four_letter_codes_are_each_letters_code() {
        // Every two-byte letter of U+0370..=U+03FF in every lane, among others and before the
        // text's end (zeros).
        let letters: Vec<char> = (0x370u32..0x400).filter_map(char::from_u32).collect();
        for (i, &c) in letters.iter().enumerate() {
            let mut text = String::new();
            for k in 0..4 {
                text.push(letters[(i + 37 * k) % letters.len()]);
            }
            let w = u64::from_le_bytes(text.as_bytes()[..8].try_into().unwrap());
            let codes = pair_codes(w).to_le_bytes();
            for (k, ch) in text.chars().enumerate() {
                assert_eq!(u32::from(codes[2 * k]), u32::from(ch) - 0x36F, "{c}");
                assert_eq!(codes[2 * k + 1], 0);
            }
            // The last letter before zeros: its code unchanged.
            let w = u64::from_le_bytes(text.as_bytes()[..8].try_into().unwrap()) & 0xFFFF;
            assert_eq!(
                u32::from(pair_codes(w) as u8),
                u32::from(text.chars().next().unwrap()) - 0x36F
            );
        }
    }

    #[test]
    fn runs_that_mix_classes_count_each_letter_by_its_class() {
        // Ukrainian letters among Russian ones (the step's slow way), a run of both from a
        // Ukrainian letter, Greek in a Cyrillic run, Hebrew points.
        let f = text_features("привітання їжачок абвгдλμνξεж שָׁלוֹם");
        assert_eq!(f[feature::CYRILLIC_UK], 2);
        assert_eq!(f[feature::CYRILLIC], 9 + 5 + 6);
        assert_eq!(f[feature::GREEK], 5);
        assert_eq!(f[feature::HEBREW], 7);
        assert_eq!(f[feature::ALPHA_RUNS], 3);
        assert_eq!(f[feature::HEBREW_RUNS], 1);
    }

    /// [`greek_pieces`] as it was before its first prefixes without the loop's count and its
    /// backward pass without a branch (7ced0dd): the reference the fast one must match.
    fn greek_pieces_reference(bytes: &[u8], from: usize, to: usize, space: bool) -> Option<u8> {
        let n = (to - from) / 2;
        if n > GREEK_PIECES_MAX {
            return None;
        }
        // Bit `k` (1..n): the first `k` letters may be a word of the table; the letters from the `k`th
        // on may be one without a space.
        // The letters' codes, computed once for the three passes: letter `k`'s in the low byte of
        // the 16-bit lane at `2 * k`.
        let mut codes = [0u8; 2 * GREEK_PIECES_MAX];
        for (k, out) in codes.chunks_exact_mut(8).enumerate().take(n.div_ceil(4)) {
            out.copy_from_slice(&pair_codes(load(bytes, from + 8 * k)).to_le_bytes());
        }
        let word = codes.get(..2 * n)?;
        let (mut pre, mut suf) = (0u32, 0u32);
        let mut h = if space { GREEK_SPACED } else { GREEK_BARE };
        let firsts = (n - 1).min(GREEK_FIRST_MAX);
        // Each answer into bit 31, the earlier ones a bit down: the `k`th at `31 - firsts + k`.
        for pair in word.get(..2 * firsts).unwrap_or(&[]).chunks_exact(2) {
            h = greek_step(h, lane_code(pair));
            pre = (pre >> 1) | ((greek_bit(h) as u32) << 31);
        }
        pre >>= 31 - firsts;
        if pre == 0 {
            return None;
        }
        // A suffix from `k` is of use if `k` is a prefix's end (two pieces) or after one (three).
        let lowest = n
            .saturating_sub(GREEK_BARE_MAX)
            .max(pre.trailing_zeros() as usize);
        let mut g = GREEK_BACK;
        let mut bit = 1u32 << n;
        for pair in word.get(2 * lowest..).unwrap_or(&[]).chunks_exact(2).rev() {
            bit >>= 1;
            g = greek_step(g, lane_code(pair));
            if greek_maybe(g) {
                if pre & bit != 0 {
                    return Some(2);
                }
                suf |= bit;
            }
        }
        // The middle pass did not change (7ced0dd's is the same function).
        greek_middle(word, pre, suf)
    }

    #[test]
    fn greek_pieces_answers_like_the_plain_reference() {
        // Words of the corpus's Greek text glued together without spaces (two-piece and
        // three-piece splits among them), cut at random letters, and random Greek letters, each
        // after a space and not: the same answer for every word of 6..=24 letters, and None for
        // the shorter ones (never asked for).
        let body = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/greek.jsonl"),
        )
        .unwrap();
        let words: Vec<Vec<char>> = body
            .split(|c: char| !('\u{0370}'..='\u{03FF}').contains(&c))
            .filter(|w| !w.is_empty())
            .map(|w| w.chars().collect())
            .collect();
        assert!(words.len() > 1_000, "{} Greek words", words.len());
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = |m: usize| (super::super::tests::xorshift(&mut x) % m as u64) as usize;
        let mut answers = [0usize; 4];
        for case in 0..40_000 {
            let mut word: Vec<char> = Vec::new();
            if case % 7 == 6 {
                for _ in 0..1 + next(26) {
                    word.push(char::from_u32(0x0370 + next(144) as u32).unwrap_or('α'));
                }
            } else {
                for _ in 0..1 + next(3) {
                    word.extend(&words[next(words.len())]);
                }
                let cut = next(word.len() + 1);
                if case % 3 == 0 {
                    word.drain(..cut.min(word.len() / 2));
                } else if case % 3 == 1 {
                    word.truncate(cut.max(word.len() / 2));
                }
            }
            let w: String = word.iter().collect();
            // Two-byte letters only, as `scan_alpha` asks.
            if w.len() != 2 * word.len() || word.is_empty() {
                continue;
            }
            let text = format!("x {w}.");
            let (from, to) = (2, 2 + w.len());
            for space in [false, true] {
                let got = greek_pieces(text.as_bytes(), from, to, space);
                if word.len() < GREEK_PIECES_MIN as usize {
                    assert_eq!(got, None, "{w}");
                    continue;
                }
                let want = greek_pieces_reference(text.as_bytes(), from, to, space);
                assert_eq!(got, want, "{w} space {space}");
                answers[usize::from(got.unwrap_or(0))] += 1;
            }
        }
        // Every answer was seen, many times.
        assert!(
            answers[0] > 1_000 && answers[2] > 1_000 && answers[3] > 300,
            "{answers:?}"
        );
    }

    /// [`thai_tokens`] as it was before its window of codes and flag bytes (73ae547): the
    /// reference the fast one must match.
    fn thai_tokens_reference(bytes: &[u8], from: usize, to: usize) -> u64 {
        let pair = |bits: &[u64; 144], a: usize, b: usize| {
            let k = a * 96 + b;
            a < 96 && b < 96 && (bits[k / 64] >> (k % 64)) & 1 != 0
        };
        let run = &bytes[from..to];
        let code = |k: usize| match run.get(k..k + 3) {
            Some(&[0xE0, b1, b2]) => Some((usize::from(b1 & 1) << 6) | usize::from(b2 & 0x3F)),
            _ => None,
        };
        let (mut n, mut i, mut at) = (0u64, 0, code(0));
        while i < run.len() {
            let Some(a) = at else {
                i += 1;
                at = code(i);
                continue;
            };
            n += 1;
            let next = code(i + 3);
            let Some(b) = next else {
                i += 3;
                at = next;
                continue;
            };
            if pair(&THAI_PREFIX, a, b) {
                if let Some(c) = code(i + 6).filter(|&c| pair(&THAI_MID, b, c)) {
                    let w = from + i;
                    if code(i + 9).is_some_and(|d| pair(&THAI_END4, c, d))
                        && known(bytes, w, w + 12, false)
                    {
                        i += 12;
                        at = code(i);
                        continue;
                    }
                    if known(bytes, w, w + 9, false) {
                        i += 9;
                        at = code(i);
                        continue;
                    }
                }
            }
            if pair(&THAI_PAIR, a, b) {
                i += 6;
                at = code(i);
            } else {
                i += 3;
                at = next;
            }
        }
        n
    }

    #[test]
    fn thai_tokens_counts_like_the_plain_reference() {
        // The Thai characters of the corpus (words of the table among them), cut at random and
        // joined again with single spaces, plus random Thai codes: the fast count matches the
        // plain one on every run, as part of a longer text (a word lookup may read the bytes
        // around the run).
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
        let mut chars: Vec<char> = Vec::new();
        for name in ["thai.jsonl", "mixed.jsonl", "short.jsonl"] {
            let body = std::fs::read_to_string(dir.join(name)).unwrap();
            chars.extend(
                body.chars()
                    .filter(|c| ('\u{0E00}'..='\u{0E7F}').contains(c)),
            );
        }
        assert!(chars.len() > 10_000, "{} Thai characters", chars.len());
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut next = |m: usize| (super::super::tests::xorshift(&mut x) % m as u64) as usize;
        let (mut runs, mut words) = (0, 0u64);
        for case in 0..3_000 {
            let mut run = String::new();
            for piece in 0..1 + next(6) {
                if piece > 0 {
                    run.push(' ');
                }
                if case % 5 == 4 {
                    // Random codes, table words or not.
                    for _ in 0..1 + next(9) {
                        run.push(char::from_u32(0x0E00 + next(128) as u32).unwrap());
                    }
                } else {
                    let start = next(chars.len());
                    let len = 1 + next(12);
                    run.extend(chars.iter().skip(start).take(len));
                }
            }
            let text = format!("x{run}.");
            let to = text.len() - 1;
            let got = thai_tokens(text.as_bytes(), 1, to);
            let want = thai_tokens_reference(text.as_bytes(), 1, to);
            assert_eq!(got, want, "{run:?}");
            runs += 1;
            words += u64::from(got < (run.chars().filter(|&c| c != ' ').count() as u64));
        }
        // The merged paths (pairs and table words) were taken, not only one character a token.
        assert!(words > 1_000, "{words} of {runs} runs merged characters");
    }
}
