#![cfg_attr(feature = "exact-text", allow(dead_code))]
//! Text → tokens: one pass over the characters that mimics o200k_base's pre-tokenizer and counts
//! features, then the weighted sum.

pub(super) use super::bytes::{
    bump, byte_class, count_while, lower_run, not_lower_mask, punct_before, Counts, B_DIGIT,
    B_HIGH, B_LOWER, B_NEWLINE, B_PUNCT, B_SPACE, B_UPPER,
};
use super::classes::{classify, decode, Cls};
pub(super) use super::latin::{count_lower_word, scan_word, scan_words, space_before};
use super::scripts::scan_non_ascii;
use super::weights::{feature, NUM_FEATURES, WEIGHTS};
pub(super) use super::whole::derive;

/// What follows a run of spaces: it decides whether the run has a feature of its own.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum AfterSpaces {
    /// An ASCII or fullwidth digit.
    Digit,
    /// A line break (which takes the spaces into its own piece), or the end of the text.
    Newline,
    Other,
}

/// The class of the character at `i` (a character boundary of valid UTF-8), as far as spaces care:
/// [`classify`](super::classes::classify) would say `Digit` for 0-9 and U+FF10..=U+FF19, `Newline` for CR, LF, U+0085, U+2028
/// and U+2029.
#[inline(always)]
pub(super) fn after_spaces(bytes: &[u8], i: usize) -> AfterSpaces {
    match bytes.get(i..) {
        None | Some([]) => AfterSpaces::Newline,
        Some([b'0'..=b'9', ..] | [0xEF, 0xBC, 0x90..=0x99, ..]) => AfterSpaces::Digit,
        Some([b'\n' | b'\r', ..] | [0xC2, 0x85, ..] | [0xE2, 0x80, 0xA8 | 0xA9, ..]) => {
            AfterSpaces::Newline
        }
        _ => AfterSpaces::Other,
    }
}

/// The [`byte_class`] of the byte before `i` (0 at the start).
#[inline(always)]
pub(super) fn prev_class(bytes: &[u8], i: usize) -> u8 {
    bytes.get(i.wrapping_sub(1)).map_or(0, |&b| byte_class(b))
}

/// [`feature::PUNCT_MIX`] and [`feature::PUNCT_REPEAT`] of one run of ASCII punctuation: its
/// characters from the fourth on that differ from the one before, and of those the ones that the
/// character after repeats. Eight characters at a time (long runs of junk), then one at a time.
#[inline(never)]
pub(crate) fn punct_mix(run: &[u8]) -> (u64, u64) {
    const LOW7: u64 = 0x7F7F_7F7F_7F7F_7F7F;
    const HI: u64 = 0x8080_8080_8080_8080;
    // High bit set in exactly the bytes of `t` that are not zero (the sum stays within each byte).
    let nonzero = |t: u64| (((t & LOW7) + LOW7) | t) & HI;
    let word = |at: usize| {
        run.get(at..at + 8)
            .and_then(|c| <[u8; 8]>::try_from(c).ok())
            .map(u64::from_le_bytes)
    };
    let (mut mix, mut repeat) = (0u64, 0u64);
    // Characters `k + 1 .. k + 9` against the ones before them and after them (all there).
    let mut k = 2;
    while let (Some(a), Some(b), Some(c)) = (word(k), word(k + 1), word(k + 2)) {
        let differ = nonzero(a ^ b);
        let again = !nonzero(b ^ c) & HI;
        mix += u64::from(differ.count_ones());
        repeat += u64::from((differ & again).count_ones());
        k += 8;
    }
    for (k, w) in run.windows(2).enumerate().skip(k) {
        if w.first() != w.get(1) {
            mix += 1;
            repeat += u64::from(run.get(k + 2).is_some_and(|c| Some(c) == w.get(1)));
        }
    }
    (mix, repeat)
}

/// Where a run of spaces and tabs lies, as far as its tabs care.
#[derive(Clone, Copy)]
pub(super) struct Tabs {
    /// It starts a line (indentation).
    pub(super) indent: bool,
    /// A line break or the end of the text follows it (o200k takes it into that piece).
    pub(super) before_newline: bool,
}

/// The tab features of one run of spaces and tabs: [`feature::TAB`] one per run of tabs plus one per
/// 16 tabs in it (o200k's longest tab tokens); in a run that starts a line [`feature::TAB_INDENT`]
/// per tab instead; before a line break or the end of the text only the one per 16.
#[inline(never)]
pub(super) fn count_tabs(run: &[u8], at: Tabs, f: &mut Counts) {
    let (mut tabs, mut runs, mut sixteens) = (0u64, 0u64, 0u64);
    let mut len = 0u64;
    for &b in run.iter().chain(std::iter::once(&b' ')) {
        if b == b'\t' {
            len += 1;
        } else if len > 0 {
            tabs += len;
            runs += 1;
            sixteens += len / 16;
            len = 0;
        }
    }
    bump(f, feature::TAB, sixteens);
    if !at.before_newline {
        if at.indent {
            bump(f, feature::TAB_INDENT, tabs);
        } else {
            bump(f, feature::TAB, runs);
        }
    }
}

/// Whether a letter (of any script) starts at `i`.
#[inline(always)]
pub(super) fn letter_at(bytes: &[u8], i: usize) -> bool {
    match bytes.get(i) {
        Some(b) if b.is_ascii_alphabetic() => true,
        Some(&b) if b >= 0xC3 => decode(bytes, i).is_some_and(|(cp, _)| {
            !matches!(
                classify(cp),
                Cls::Punct
                    | Cls::WidePunct
                    | Cls::Symbol
                    | Cls::Emoji
                    | Cls::Other
                    | Cls::ZeroWidth
                    | Cls::Space
                    | Cls::Newline
                    | Cls::Digit
            )
        }),
        _ => false,
    }
}

/// High bit set in each byte of `w` that is not ASCII punctuation (SWAR, exact in every byte).
#[inline(always)]
pub(super) fn not_punct_mask(w: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = ONES * 0x80;
    // Seven bits of each byte: the sums below stay within it.
    let x = w & !HI;
    let at_least = |v: u64, c: u8| v.wrapping_add(ONES * u64::from(0x80 - c));
    let folded = x | (ONES * 0x20);
    let letter = at_least(folded, b'a') & !at_least(folded, b'z' + 1);
    let digit = at_least(x, b'0') & !at_least(x, b'9' + 1);
    (w | !at_least(x, b'!') | at_least(x, 0x7F) | letter | digit) & HI
}

/// Length of the run of ASCII punctuation at `i` (which is punctuation): most are one character;
/// long ones (junk) are measured eight bytes at a time.
#[inline(always)]
fn punct_run(bytes: &[u8], i: usize) -> usize {
    if bytes
        .get(i + 1)
        .is_none_or(|&b| byte_class(b) & B_PUNCT == 0)
    {
        return 1;
    }
    let mut n = 2;
    // `i + n` ≤ `bytes.len()` throughout, so the sums cannot overflow.
    while let Some(chunk) = bytes.get(i + n..i + n + 8) {
        let m = not_punct_mask(<[u8; 8]>::try_from(chunk).map_or(0, u64::from_le_bytes));
        if m != 0 {
            return n + (m.trailing_zeros() / 8) as usize;
        }
        n += 8;
    }
    n + run_of_class(bytes, i + n, B_PUNCT)
}

/// High bit set in each byte of `w` that is not an ASCII digit (SWAR, exact in every byte).
#[inline(always)]
pub(super) fn not_digit_mask(w: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = ONES * 0x80;
    // Seven bits of each byte: the sums below stay within it.
    let x = w & !HI;
    let at_least = |v: u64, c: u8| v.wrapping_add(ONES * u64::from(0x80 - c));
    (w | !at_least(x, b'0') | at_least(x, b'9' + 1)) & HI
}

/// Length of the run of ASCII digits at `i`: from one load where it ends within eight bytes (numbers
/// in tables: years, amounts, dates' parts), else a byte at a time.
#[inline(always)]
fn digit_run(bytes: &[u8], i: usize) -> usize {
    if let Some(chunk) = bytes.get(i..i + 8) {
        let m = not_digit_mask(<[u8; 8]>::try_from(chunk).map_or(0, u64::from_le_bytes));
        if m != 0 {
            return (m.trailing_zeros() / 8) as usize;
        }
    }
    run_of_class(bytes, i, B_DIGIT)
}

/// Digit runs from `i` (a digit) and the single punctuation characters between and after them
/// (dates, decimals, percentages: `2024-08-23`, `710.05`, `17%`) in one step, counted as the
/// byte-wise loop counts each. Returns where they end and whether a punctuation character ends
/// them (it follows a digit, not a space: a word right after it merges with it).
#[inline(always)]
fn digits(bytes: &[u8], mut i: usize, f: &mut Counts) -> (usize, bool) {
    let (mut groups, mut puncts) = (0u64, 0u64);
    let mut single_punct = false;
    loop {
        let len = digit_run(bytes, i);
        i += len;
        // `len.div_ceil(3)` (`len` ≤ `bytes.len()`: the sum cannot overflow), without the
        // overflow-safe sequence `div_ceil` compiles to.
        #[allow(clippy::manual_div_ceil)]
        {
            groups += ((len + 2) / 3) as u64;
        }
        let Some(&p) = bytes.get(i) else { break };
        if byte_class(p) & B_PUNCT == 0 {
            break;
        }
        let next = bytes.get(i + 1).copied().unwrap_or(b' ');
        if byte_class(next) & B_PUNCT != 0 {
            break;
        }
        puncts += 1;
        i += 1;
        if !next.is_ascii_digit() {
            single_punct = true;
            break;
        }
    }
    bump(f, feature::DIGIT_GROUPS, groups);
    bump(f, feature::PUNCT, puncts);
    bump(f, feature::PUNCT_RUNS, puncts);
    (i, single_punct)
}

/// A lone tab between two cells, the next one starting with `cell`: counted as the byte-wise loop
/// counts a lone tab after a cell (not at a line's start) where `cell` is ASCII and not a space, a
/// tab or a line break (then returned; None, and nothing counted, otherwise).
#[inline(always)]
fn cell_after_tab(cell: u8, f: &mut Counts) -> Option<u8> {
    if cell >= 0x80 || byte_class(cell) & (B_SPACE | B_NEWLINE) != 0 {
        return None;
    }
    bump(f, feature::TAB, 1);
    bump(f, feature::TAB_WORD, u64::from(cell.is_ascii_alphabetic()));
    Some(cell)
}

/// Number of bytes from `i` on whose class is in `classes`.
#[inline(always)]
pub(super) fn run_of_class(bytes: &[u8], i: usize, classes: u8) -> usize {
    count_while(bytes, i, |b| byte_class(b) & classes != 0)
}

/// Count the features of `text` in one pass (exposed for the calibration program and the bench).
#[doc(hidden)]
pub fn text_features(text: &str) -> [u64; NUM_FEATURES] {
    let mut f: Counts = [0; NUM_FEATURES];
    if !text.is_empty() {
        // A `&str` is valid UTF-8: the scan never stops early.
        count_text(text.as_bytes(), &mut f);
        derive(&mut f, text.as_bytes());
    }
    f
}

/// Script-aware token estimate for one piece of text (the core). 0 for empty text, at least 1 otherwise.
pub fn text_tokens(text: &str) -> u64 {
    // A `&str` is valid UTF-8: never None.
    utf8_tokens(text.as_bytes()).unwrap_or(0)
}

/// [`text_tokens`] of bytes that may not be UTF-8 (a string read raw from the body): None if they are
/// not, checked in the same pass that counts them.
pub(super) fn utf8_tokens(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() {
        return Some(0);
    }
    // The .wasm that measures exact counting in Envoy (see `exact.rs`).
    #[cfg(feature = "exact-text")]
    return std::str::from_utf8(bytes)
        .ok()
        .map(|t| super::exact::count(t).max(1));
    #[cfg(not(feature = "exact-text"))]
    {
        let windows = windows_pay(bytes);
        if windows || !TWO_LOOPS {
            tokens_of::<true>(bytes, windows)
        } else {
            tokens_of::<false>(bytes, false)
        }
    }
}

/// [`utf8_tokens`] of non-empty `bytes` by [`count_features`] (one function for each loop, see
/// [`TWO_LOOPS`]).
#[inline(never)]
pub(super) fn tokens_of<const WINDOWS: bool>(bytes: &[u8], windows: bool) -> Option<u64> {
    let mut f: Counts = [0; NUM_FEATURES];
    if !count_features::<WINDOWS>(bytes, &mut f, windows) {
        return None;
    }
    derive(&mut f, bytes);
    Some(rounded(weighed(&f)))
}

/// The weighted sum of the counts, in feature order (as a plain loop over all of them would add).
/// Zero counts add nothing (the sum is never -0.0), so they are skipped, four at a time: short
/// texts touch few features.
#[inline(always)]
fn weighed(f: &Counts) -> f64 {
    let mut sum = 0.0f64;
    for (counts, weights) in f.chunks_exact(4).zip(WEIGHTS.chunks_exact(4)) {
        if counts.iter().fold(0, |any, &c| any | c) != 0 {
            for (&count, w) in counts.iter().zip(weights) {
                if count != 0 {
                    // Every count is at most twice the text's length in bytes (a slice in memory:
                    // below 2^62), so below 2^63 and converted as an i64 (one instruction; u64's
                    // takes six) to the same value. u64 → f64 loses precision only beyond 2^53
                    // features, far beyond any body.
                    sum += count as i64 as f64 * w;
                }
            }
        }
    }
    sum
}

/// `sum.round()` as a count of at least 1 (`as` saturates, NaN → 0). Between 0 and 2^62 without
/// libm's `round` call (the baseline x86-64 target has no rounding instruction): the truncation and
/// the exact fraction left (`sum - trunc(sum)` is exact), rounded half away from zero as `round`.
#[inline(always)]
fn rounded(sum: f64) -> u64 {
    if (0.0..4.6e18).contains(&sum) {
        let t = sum as i64;
        let up = sum - t as f64 >= 0.5;
        (t as u64 + u64::from(up)).max(1)
    } else {
        (sum.round() as u64).max(1)
    }
}

/// Whether `bytes` is worth reading with ASCII windows: long enough (a window costs about what the
/// byte-wise loop pays for 40 to 60 bytes of code, and most chat messages are shorter) and mostly
/// ASCII.
#[inline(always)]
pub(super) fn windows_pay(bytes: &[u8]) -> bool {
    bytes.len() >= super::ascii::MIN_TEXT && super::ascii::mostly(bytes)
}

/// [`count_features`], with ASCII windows where they pay (see [`windows_pay`]).
#[inline(always)]
pub(super) fn count_text(bytes: &[u8], f: &mut Counts) -> bool {
    let windows = windows_pay(bytes);
    if windows || !TWO_LOOPS {
        count_features::<true>(bytes, f, windows)
    } else {
        count_features::<false>(bytes, f, false)
    }
}

/// Whether text that is not read with ASCII windows has a loop of its own, without them. Where it
/// does not, windows are rarely used, but natively (x86_64) their mere presence in the loop slows the
/// script loops down by a few percent; the wasm build has the one loop, which is smaller.
pub(super) const TWO_LOOPS: bool = !cfg!(target_arch = "wasm32");

/// The loop of [`text_features`]. Returns false (and stops) where `bytes` is not UTF-8: every
/// non-ASCII character is decoded by [`decode`] or by a pattern that only matches valid sequences.
/// `WINDOWS` and `windows`: ASCII is counted a window at a time where it can be (the counts are the
/// same).
#[inline(always)]
pub(super) fn count_features<const WINDOWS: bool>(
    bytes: &[u8],
    f: &mut Counts,
    windows: bool,
) -> bool {
    count_pieces::<WINDOWS, true>(bytes, f, windows)
}

/// [`count_features`]; `CELLS`: with the steps that take a table's cells and their separators
/// together (a lone tab and the word or digits after it, ` | ` and ` |\n| `, a word after `,`, a
/// lone space before digits, a short blank run before a line break), else each piece on its own
/// (the plain loop, for the tests: the counts are the same).
#[inline(always)]
pub(super) fn count_pieces<const WINDOWS: bool, const CELLS: bool>(
    bytes: &[u8],
    f: &mut Counts,
    windows: bool,
) -> bool {
    // Index arithmetic is bounded by `bytes.len()` (≤ isize::MAX), so plain `+` cannot overflow.
    let mut i = 0usize;
    // The previous run was a single ASCII punctuation character (it merges into a following word).
    let mut after_punct = false;
    // ASCII is read a window at a time (see `ascii.rs`) from here on.
    let mut windows_at = if windows { 0 } else { usize::MAX };
    let mut tally = super::ascii::Tally::default();
    'bytes: while let Some(&b) = bytes.get(i) {
        if WINDOWS && b < 0x80 && i >= windows_at {
            match super::ascii::window(bytes, i, after_punct, &mut tally) {
                super::ascii::Step::Counted {
                    next,
                    after_punct: single_punct,
                    prose,
                } => {
                    i = next;
                    after_punct = single_punct;
                    if prose {
                        windows_at = next + super::ascii::PROSE;
                    }
                    continue;
                }
                super::ascii::Step::Declined { until } => windows_at = until,
            }
        }
        let was_punct = after_punct;
        after_punct = false;
        let class = byte_class(b);
        if class & B_LOWER != 0 {
            // Fast path: words of ASCII lower-case letters not followed by an accented letter, the
            // single spaces between them (which have no feature of their own), and a capitalised
            // word after one.
            let mut was_punct = was_punct;
            // A lower-case word starts after a letter only where that letter is not ASCII.
            if prev_class(bytes, i) & B_DIGIT != 0 {
                bump(f, feature::ALNUM_SWITCH, 1);
            }
            loop {
                // Words shorter than eight letters (most): what follows them is in the same load.
                if let Some(w) = bytes
                    .get(i..i + 8)
                    .and_then(|c| <[u8; 8]>::try_from(c).ok())
                {
                    let w = u64::from_le_bytes(w);
                    let m = not_lower_mask(w);
                    if m != 0 {
                        // 1..=7: the byte at `i` is a letter.
                        let len = (m.trailing_zeros() / 8) as usize;
                        let next = (w >> (8 * len)) as u8;
                        if next >= 0x80 {
                            i = scan_words(bytes, i, f, was_punct);
                            break;
                        }
                        count_lower_word(bytes, f, i, len, Some(w));
                        if was_punct {
                            bump(f, feature::PUNCT_WORD, 1);
                        }
                        i += len;
                        let after = if len < 7 {
                            (w >> (8 * (len + 1))) as u8
                        } else {
                            match bytes.get(i + 1) {
                                Some(&b) => b,
                                None => break,
                            }
                        };
                        if next == b' ' {
                            if after.is_ascii_lowercase() {
                                i += 1;
                                was_punct = false;
                                continue;
                            }
                            if after.is_ascii_uppercase() {
                                i = scan_word(bytes, i + 1, f, false);
                            }
                            break;
                        }
                        // Cells of words: a lone tab between two words (a piece of its own,
                        // before a letter), or a single punctuation character (`a,b`: it merges
                        // into the word after it), as the tab and punctuation branches count them.
                        if !CELLS {
                            break;
                        }
                        if !after.is_ascii_lowercase() {
                            break;
                        }
                        if next == b'\t' {
                            bump(f, feature::TAB, 1);
                            bump(f, feature::TAB_WORD, 1);
                            i += 1;
                            was_punct = false;
                            continue;
                        }
                        if byte_class(next) & B_PUNCT != 0 {
                            bump(f, feature::PUNCT, 1);
                            bump(f, feature::PUNCT_RUNS, 1);
                            i += 1;
                            was_punct = true;
                            continue;
                        }
                        break;
                    }
                }
                let len = lower_run(bytes, i);
                if bytes.get(i + len).is_some_and(|&n| n >= 0x80) {
                    i = scan_words(bytes, i, f, was_punct);
                    break;
                }
                count_lower_word(bytes, f, i, len, None);
                if was_punct {
                    bump(f, feature::PUNCT_WORD, 1);
                }
                i += len;
                match bytes.get(i..i + 2) {
                    Some([b' ', n]) if n.is_ascii_lowercase() => {
                        i += 1;
                        was_punct = false;
                    }
                    Some([b' ', n]) if n.is_ascii_uppercase() => {
                        i = scan_word(bytes, i + 1, f, false);
                        break;
                    }
                    _ => break,
                }
            }
        } else if class & B_SPACE != 0 {
            // The common case first: one space between two words has no feature of its own (it has
            // one only before a digit, ASCII or fullwidth, whose UTF-8 starts with 0xEF).
            if b == b' ' {
                // Markdown's ` | ` between cells taken in the same step (the pipe is a run of
                // one after a space: it does not merge into what follows); `i`: a space.
                while let Some(&n) = bytes.get(i + 1) {
                    let class = byte_class(n);
                    if class & (B_SPACE | B_DIGIT) == 0 && n != 0xEF {
                        if CELLS && n == b'|' {
                            if bytes.get(i + 2) == Some(&b' ') {
                                bump(f, feature::PUNCT, 1);
                                bump(f, feature::PUNCT_RUNS, 1);
                                i += 2;
                                continue;
                            }
                            // A row's end and the next row's start (` |\n| `): the line break
                            // follows punctuation.
                            if bytes.get(i + 2..i + 5) == Some(b"\n| ") {
                                bump(f, feature::PUNCT, 2);
                                bump(f, feature::PUNCT_RUNS, 2);
                                bump(f, feature::PUNCT_NEWLINE, 1);
                                i += 4;
                                continue;
                            }
                        }
                        i += 1;
                        continue 'bytes;
                    }
                    if CELLS && class & B_DIGIT != 0 {
                        // A lone space before an ASCII digit: a piece of its own.
                        bump(f, feature::SPACE_BEFORE_DIGIT, 1);
                        i += 1;
                        continue 'bytes;
                    }
                    break;
                }
            }
            // A single tab (tab-separated values): one piece of its own (none before a line break,
            // which takes it into its piece).
            if b == b'\t' {
                let next = bytes.get(i + 1).copied().unwrap_or(b'\n');
                if next != b' ' && next != b'\t' {
                    i += 1;
                    // What follows, from the byte at hand where it is ASCII (most cells): a line
                    // break or not, a letter or not.
                    let (newline, letter) = if next < 0x80 {
                        (next == b'\n' || next == b'\r', next.is_ascii_alphabetic())
                    } else {
                        (
                            after_spaces(bytes, i) == AfterSpaces::Newline,
                            letter_at(bytes, i),
                        )
                    };
                    if !newline {
                        let tab = if prev_class(bytes, i - 1) & B_NEWLINE != 0 {
                            feature::TAB_INDENT
                        } else {
                            feature::TAB
                        };
                        // A lone tab is a piece of its own, before a digit too (there is no
                        // space to set apart).
                        bump(f, tab, 1);
                        bump(f, feature::TAB_WORD, u64::from(letter));
                    }
                    continue;
                }
            }
            let len = run_of_class(bytes, i, B_SPACE);
            let after = after_spaces(bytes, i + len);
            if CELLS && after == AfterSpaces::Newline && len < 16 {
                // Before a line break or the end: part of its piece, no tab feature (fewer than
                // 16 tabs), no letter after it.
                i += len;
                continue;
            }
            if bytes.get(i + len - 1) == Some(&b'\t') && letter_at(bytes, i + len) {
                bump(f, feature::TAB_WORD, 1);
            }
            if b == b'\t' || bytes.get(i + 1) == Some(&b'\t') || len > 2 {
                let run = Tabs {
                    indent: prev_class(bytes, i) & B_NEWLINE != 0,
                    before_newline: after == AfterSpaces::Newline,
                };
                count_tabs(bytes.get(i..i + len).unwrap_or(&[]), run, f);
            }
            i += len;
            bump(f, feature::SPACE_128, (len / 128) as u64);
            match after {
                // The last space before a digit is a piece of its own (a last tab is counted by
                // `count_tabs`).
                AfterSpaces::Digit => {
                    if bytes.get(i - 1) == Some(&b' ') {
                        bump(f, feature::SPACE_BEFORE_DIGIT, 1);
                    }
                }
                // Spaces before a newline or at the end belong to the newline piece.
                AfterSpaces::Newline => continue,
                AfterSpaces::Other => {}
            }
            if len >= 2 {
                bump(f, feature::SPACE_RUNS, 1);
            }
        } else if class & B_PUNCT != 0 {
            let len = punct_run(bytes, i);
            if len >= 4 {
                let (mix, repeat) = punct_mix(bytes.get(i..i + len).unwrap_or(&[]));
                bump(f, feature::PUNCT_MIX, mix);
                bump(f, feature::PUNCT_REPEAT, repeat);
            }
            // A single punctuation character merges into a word right after it, unless a space
            // comes before it (o200k then takes the space and the character as one piece).
            after_punct = len == 1 && !space_before(bytes, i);
            i += len;
            bump(f, feature::PUNCT, len as u64);
            bump(f, feature::PUNCT_RUNS, 1);
        } else if class & B_UPPER != 0 {
            let prev = prev_class(bytes, i);
            if prev & (B_LOWER | B_UPPER) != 0 {
                bump(f, feature::HUMP, 1);
            } else if prev & B_DIGIT != 0 {
                bump(f, feature::ALNUM_SWITCH, 1);
            }
            i = scan_word(bytes, i, f, was_punct);
        } else if class & B_DIGIT != 0 {
            if prev_class(bytes, i) & (B_LOWER | B_UPPER) != 0 {
                bump(f, feature::ALNUM_SWITCH, 1);
            }
            loop {
                let (next, single_punct) = digits(bytes, i, f);
                i = next;
                after_punct = single_punct;
                // A lone tab after the cell, before one that starts with ASCII: the digits of
                // the next cell in the same step.
                if !CELLS || bytes.get(i) != Some(&b'\t') {
                    break;
                }
                let Some(cell) = bytes.get(i + 1).and_then(|&c| cell_after_tab(c, f)) else {
                    break;
                };
                i += 1;
                after_punct = false;
                if !cell.is_ascii_digit() {
                    break;
                }
            }
        } else if class & B_NEWLINE != 0 {
            let newline = if punct_before(bytes, i) {
                feature::PUNCT_NEWLINE
            } else {
                feature::NEWLINE_RUNS
            };
            // Most runs are one line break: told from the byte after it.
            let len = if bytes
                .get(i + 1)
                .is_some_and(|&b| byte_class(b) & B_NEWLINE != 0)
            {
                run_of_class(bytes, i, B_NEWLINE)
            } else {
                1
            };
            i += len;
            bump(f, newline, 1);
            bump(f, feature::NEWLINE_16, (len / 16) as u64);
        } else if class & B_HIGH != 0 {
            match scan_non_ascii(bytes, i, f, was_punct) {
                Some(next) => i = next,
                None => return false,
            }
        } else {
            // Other control characters.
            bump(f, feature::OTHER, 1);
            i += 1;
        }
    }
    if WINDOWS {
        tally.add_to(f);
    }
    true
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::super::tests::xorshift;
    use super::*;

    /// The loop with its cell steps and without (with and without ASCII windows): the same counts
    /// and the same verdict on UTF-8.
    fn cells_count_like_pieces(text: &str) {
        let bytes = text.as_bytes();
        let mut plain: Counts = [0; NUM_FEATURES];
        let ok = count_pieces::<false, false>(bytes, &mut plain, false);
        for windows in [false, true] {
            let mut cells: Counts = [0; NUM_FEATURES];
            let verdict = if windows {
                count_pieces::<true, true>(bytes, &mut cells, true)
            } else {
                count_pieces::<false, true>(bytes, &mut cells, false)
            };
            assert_eq!(verdict, ok, "{text:?}");
            // Which short words are asked of their table depends on the path (see
            // `ascii_windows_count_like_the_byte_wise_loop`).
            let mut plain = plain;
            for f in [&mut cells, &mut plain] {
                f[feature::SHORT_ASKED] = 0;
                f[feature::LATIN_SHORT_UNKNOWN] = 0;
            }
            assert_eq!(cells, plain, "{text:?} (windows: {windows})");
        }
    }

    #[test]
    fn table_cells_count_like_the_plain_loop() {
        // Random tables: cells of every kind the cell steps look at (words, digits with their
        // punctuation, capitals, other scripts, fullwidth digits, punctuation, empty) between every
        // separator they take and the ones next to them (runs of tabs and spaces, line breaks of
        // every kind, Markdown's pipes); then the corpus's tables.
        let cells = [
            "",
            "a",
            "the",
            "word",
            "bucket's",
            "internationalization",
            "Word",
            "ABC",
            "x1",
            "17%",
            "-342",
            "2024-08-23",
            "710.05",
            "3,153",
            "0",
            "12345678901",
            "8%-",
            "снег",
            "中文",
            "\u{ff11}\u{ff12}",
            "é",
            "Für",
            "--",
            "...",
            "'",
            "%",
            "|",
            "|---|",
            "\u{1}",
        ];
        let seps = [
            "\t",
            "\t",
            "\t",
            "\t\t",
            "\n",
            "\r\n",
            "\r",
            ",",
            ",",
            " | ",
            " | ",
            " |\n| ",
            " |\n|",
            " |\r\n| ",
            " |\n",
            " ",
            "  ",
            "\t\n",
            "\t\t\n",
            " \t",
            "\t ",
            "\n\t",
            "\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\n",
            "               \n",
            " |",
            "| ",
            "|",
            ",,",
            ", ",
            "\u{2028}",
            "\u{85}",
            "\t\u{85}",
            " \u{ff10}",
        ];
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut next = |m: usize| (xorshift(&mut x) % m as u64) as usize;
        for _ in 0..30_000 {
            let mut text = String::new();
            if next(3) == 0 {
                text.push_str(seps[next(seps.len())]);
            }
            for _ in 0..1 + next(12) {
                text.push_str(cells[next(cells.len())]);
                text.push_str(seps[next(seps.len())]);
            }
            if next(2) == 0 {
                text.push_str(cells[next(cells.len())]);
            }
            cells_count_like_pieces(&text);
        }
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
        let body = std::fs::read_to_string(dir.join("tables.jsonl")).unwrap();
        let mut lines = 0;
        for line in body.lines().filter(|l| !l.trim().is_empty()) {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            cells_count_like_pieces(v["text"].as_str().unwrap());
            lines += 1;
        }
        assert!(lines > 50, "{lines} corpus lines");
    }
}
