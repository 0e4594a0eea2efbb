//! ASCII text counted a window of 64 bytes at a time, without a branch per piece.
//!
//! [`super::text::count_features`] splits text into pieces (a word, a run of digits, spaces, newlines or
//! punctuation, a control character) and dispatches on each; in code and JSON a piece is three bytes
//! long on average, so that dispatch, and the loop that finds where each short run ends, cost most of
//! the time. For ASCII the features of a piece depend only on its class, its length and its neighbours,
//! so here they are computed for a whole window from bit masks (bit `k` for byte `k` of the window):
//! the window's 64 bytes are turned into bit planes (bit `k` of plane `i` is bit `i` of byte `k`) by
//! two 8×8 transposes of words, the classes read from the planes with a few operations on whole
//! masks, and the counts taken with population counts of masks (compilers vectorize those). Word
//! lengths too: the starts of words of at
//! least `k` letters are a mask for each `k` up to 11, so only the rarer long and all-capital words
//! and the digit runs (groups of three) are visited one by one.
//!
//! A window starts at a piece boundary and is ASCII to its end or to the end of the text (a window
//! cut short by a non-ASCII byte is declined: it costs as much and counts less). Every piece that
//! starts in it is counted except the last one, which may go on past the window (into a Latin letter
//! that continues a word, a fullwidth digit after spaces, …) and is left to the next window; at the
//! end of the text the last piece is counted too. The counts are those of the byte-wise loop, piece for
//! piece (the tests compare the two on every kind of text). Prose, which the byte-wise loop reads
//! about as fast (its words and single spaces take a fast path), goes back to it for a while.

use super::bytes::{bump, punct_before, Counts};
use super::weights::feature;
use super::weights::SHORT_PROBES;
use super::words::{known, load, rare_pairs, short_known};

const ONES: u64 = 0x0101_0101_0101_0101;
const HI: u64 = ONES * 0x80;

/// Bytes in a window.
const WINDOW: usize = 64;

/// Shortest text read with windows.
pub(super) const MIN_TEXT: usize = 64;

/// Bytes the byte-wise loop reads after a window that looked like prose, before the next window.
pub(super) const PROSE: usize = 192;

/// The classes of the bytes of one ASCII window (bit `k` for byte `k`).
struct Classes {
    lower: u64,
    upper: u64,
    digit: u64,
    /// Spaces and tabs.
    space: u64,
    /// LF and CR.
    newline: u64,
    /// Other control characters and DEL.
    control: u64,
    tab: u64,
}

impl Classes {
    /// The classes of the 64 bytes of `w` (eight little-endian words, every byte below 0x80): the
    /// bytes are turned into seven bit planes (bit `k` of plane `i` is bit `i` of byte `k`) by
    /// transposing each word's 8×8 bit matrix and then the 8×8 byte matrix of the words, and the
    /// classes are read from the planes with a few operations on whole windows (cheaper than
    /// classifying eight bytes at a time and gathering each class's bits).
    #[inline(always)]
    fn of(w: [u64; 8]) -> Self {
        let [b0, b1, b2, b3, b4, b5, b6, _] = bit_planes(w);
        let low5 = b0 | b1 | b2 | b3 | b4;
        // The low five bits 1..=26: a letter where bit 6 is set.
        let alpha = low5 & !(b4 & b3 & (b2 | (b1 & b0)));
        let below_20 = !b6 & !b5;
        // 0x08..=0x0F.
        let eights = below_20 & !b4 & b3;
        let tab = eights & !b2 & !b1 & b0;
        let lf = eights & !b2 & b1 & !b0;
        let cr = eights & b2 & !b1 & b0;
        let del = b6 & b5 & b4 & b3 & b2 & b1 & b0;
        Classes {
            lower: b6 & b5 & alpha,
            upper: b6 & !b5 & alpha,
            digit: !b6 & b5 & b4 & !(b3 & (b2 | b1)),
            space: (b5 & !b6 & !low5) | tab,
            newline: lf | cr,
            control: (below_20 & !tab & !lf & !cr) | del,
            tab,
        }
    }
}

/// The bit planes of the 64 bytes of `w`: bit `8k + j` of plane `i` is bit `i` of byte `j` of `w[k]`.
/// Two 8×8 transposes by swapping blocks (Hacker's Delight, 7-3): of the byte matrix of the words
/// (row: word, column: byte), which makes word `j` the bytes `j` of every word; then, byte by byte,
/// of the matrix of those words' bits (row: word, column: bit of the byte).
#[inline(always)]
fn bit_planes(w: [u64; 8]) -> [u64; 8] {
    // Blocks of 4, 2 and 1 bytes, then, within each byte, of 4, 2 and 1 bits (bit `i` of each
    // byte of word `j` swapped with bit `j` of the same byte of word `i`).
    let bytes = transpose8(
        w,
        [32, 16, 8],
        [
            0x0000_0000_FFFF_FFFF,
            0x0000_FFFF_0000_FFFF,
            0x00FF_00FF_00FF_00FF,
        ],
    );
    transpose8(
        bytes,
        [4, 2, 1],
        [
            0x0F0F_0F0F_0F0F_0F0F,
            0x3333_3333_3333_3333,
            0x5555_5555_5555_5555,
        ],
    )
}

/// One 8×8 transpose of blocks of `w`: the blocks of `shift[0]` bits selected by `mask[0]` swapped
/// between words four apart, then of `shift[1]` between words two apart, then of `shift[2]` between
/// neighbours.
#[inline(always)]
fn transpose8(w: [u64; 8], shift: [u32; 3], mask: [u64; 3]) -> [u64; 8] {
    let swap = |a: u64, b: u64, shift: u32, mask: u64| {
        let s = ((a >> shift) ^ b) & mask;
        (a ^ (s << shift), b ^ s)
    };
    let [t0, t1, t2, t3, t4, t5, t6, t7] = w;
    let [s0, s1, s2] = shift;
    let [m0, m1, m2] = mask;
    let (t0, t4) = swap(t0, t4, s0, m0);
    let (t1, t5) = swap(t1, t5, s0, m0);
    let (t2, t6) = swap(t2, t6, s0, m0);
    let (t3, t7) = swap(t3, t7, s0, m0);
    let (t0, t2) = swap(t0, t2, s1, m1);
    let (t1, t3) = swap(t1, t3, s1, m1);
    let (t4, t6) = swap(t4, t6, s1, m1);
    let (t5, t7) = swap(t5, t7, s1, m1);
    let (t0, t1) = swap(t0, t1, s2, m2);
    let (t2, t3) = swap(t2, t3, s2, m2);
    let (t4, t5) = swap(t4, t5, s2, m2);
    let (t6, t7) = swap(t6, t7, s2, m2);
    [t0, t1, t2, t3, t4, t5, t6, t7]
}

/// The eight bytes at `k * 8` of a window as a little-endian word.
#[inline(always)]
fn word(src: &[u8; WINDOW], k: usize) -> u64 {
    src.get(8 * k..8 * k + 8)
        .and_then(|c| <[u8; 8]>::try_from(c).ok())
        .map_or(0, u64::from_le_bytes)
}

/// What windows counted, added to the text's features at its end ([`Tally::add_to`]); kept apart
/// from them so that the window's sums, which compilers vectorize, do not wait on the byte-wise
/// loop's stores to the same counters.
#[derive(Default)]
pub(super) struct Tally {
    /// Punctuation, its runs, newline runs, other control characters, upper-case letters, spaces
    /// before digits, space runs, words after one punctuation character; then words of at least 1,
    /// 2, …, 9 and 11 letters; camelCase humps, letter/digit switches.
    n: [u64; 20],
    long_letters: u64,
    /// Words of more than 20 letters the table does not know (see [`feature::WORD_EXCESS_LETTERS`]).
    over_20: u64,
    caps_letters: u64,
    digit_groups: u64,
    punct_mix: u64,
    punct_repeat: u64,
    newline_16: u64,
    tabs: u64,
    indent_tabs: u64,
    /// Words the table knows, after a space and not (see `words.rs`; left out of the counts above:
    /// their lengths, letters and capitals).
    known: [u64; 2],
    /// Line-break runs right after punctuation; tabs right before a letter.
    punct_newlines: u64,
    tab_words: u64,
    /// Rare letter pairs of the words of five letters or more the table does not know.
    rare_pairs: u64,
    /// Lower-case words of three or four letters that are not an o200k token, and of them those
    /// asked (as `short_unknown` in `latin.rs`: the first few, all once two were not tokens).
    short_unknown: u64,
    short_asked: u64,
}

impl Tally {
    /// Adds the counts to `f`.
    pub(super) fn add_to(&self, f: &mut Counts) {
        let [punct, runs, newlines, controls, uppers, before_digit, space_runs, punct_words, w1, w2, w3, w4, w5, w6, w7, w8, w9, w11, humps, switches] =
            self.n;
        bump(f, feature::PUNCT, punct);
        bump(f, feature::PUNCT_RUNS, runs);
        bump(f, feature::NEWLINE_RUNS, newlines);
        bump(f, feature::OTHER, controls);
        bump(f, feature::UPPER, uppers);
        bump(f, feature::SPACE_BEFORE_DIGIT, before_digit);
        bump(f, feature::SPACE_RUNS, space_runs);
        bump(f, feature::PUNCT_WORD, punct_words);
        // Words of each length 1..=8, 9 or 10, 11 or more (each count at least the next: every word
        // of k + 1 letters or more has k or more).
        // Known words (all of five letters or more) are not in these: they are counted as such.
        for (k, (a, b)) in [w1, w2, w3, w4, w5, w6, w7, w8]
            .iter()
            .zip([w2, w3, w4, w5, w6, w7, w8, w9])
            .enumerate()
        {
            bump(f, feature::WORD_1 + k, a - b);
        }
        bump(f, feature::WORD_9_10, w9 - w11);
        bump(f, feature::WORD_LONG, w11);
        bump(f, feature::WORD_LONG_CHARS, self.long_letters);
        bump(f, feature::WORD_EXCESS_LETTERS, self.over_20);
        bump(f, feature::PUNCT_NEWLINE, self.punct_newlines);
        bump(f, feature::TAB_WORD, self.tab_words);
        bump(f, feature::LATIN_RARE_PAIR, self.rare_pairs);
        bump(f, feature::LATIN_SHORT_UNKNOWN, self.short_unknown);
        bump(f, feature::SHORT_ASKED, self.short_asked);
        let [known_space, known_bare] = self.known;
        bump(f, feature::LATIN_KNOWN, known_space);
        bump(f, feature::LATIN_KNOWN_BARE, known_bare);
        bump(f, feature::CAPS_WORD_CHARS, self.caps_letters);
        bump(f, feature::DIGIT_GROUPS, self.digit_groups);
        bump(f, feature::HUMP, humps);
        bump(f, feature::ALNUM_SWITCH, switches);
        bump(f, feature::PUNCT_MIX, self.punct_mix);
        bump(f, feature::PUNCT_REPEAT, self.punct_repeat);
        bump(f, feature::NEWLINE_16, self.newline_16);
        bump(f, feature::TAB, self.tabs);
        bump(f, feature::TAB_INDENT, self.indent_tabs);
    }
}

/// What [`window`] did.
pub(super) enum Step {
    /// Counted the pieces up to `next` (a piece boundary after the window's start); `after_punct`:
    /// the piece before `next` is a single punctuation character; `prose`: the window looked like
    /// prose (few punctuation runs, no line breaks), which the byte-wise loop reads about as fast.
    Counted {
        next: usize,
        after_punct: bool,
        prose: bool,
    },
    /// Counted nothing: the byte-wise loop goes on at least up to `until` (a window past a non-ASCII
    /// byte close ahead: text with one has more, or past the one piece that fills the window).
    Declined { until: usize },
}

/// Counts the pieces of `bytes` that start in the window at `i` (a piece boundary; `after_punct`:
/// the piece before it is a single punctuation character), as [`super::text::count_features`] would, if
/// the window is ASCII to its end or to the end of the text (a shorter window costs as much and
/// counts less than the byte-wise loop).
#[inline(never)]
pub(super) fn window(bytes: &[u8], i: usize, after_punct: bool, t: &mut Tally) -> Step {
    let declined = Step::Declined { until: i + 1 };
    let Some(rest) = bytes.get(i..) else {
        return declined;
    };
    // Most windows declined in text of other scripts have a non-ASCII byte in their first 16.
    let first16 = |k: usize| {
        rest.get(8 * k..8 * k + 8)
            .and_then(|c| <[u8; 8]>::try_from(c).ok())
            .map_or(0, u64::from_le_bytes)
            & HI
    };
    for k in 0..2 {
        let h = first16(k);
        if h != 0 {
            return Step::Declined {
                until: i + 8 * k + (h.trailing_zeros() / 8) as usize + WINDOW,
            };
        }
    }
    let mut buf = [b'a'; WINDOW];
    let src: &[u8; WINDOW] = match rest.first_chunk::<WINDOW>() {
        Some(full) => full,
        None => {
            // The end of the text: padded with letters (masked out below).
            match buf.get_mut(..rest.len()) {
                Some(head) => head.copy_from_slice(rest),
                None => return declined,
            }
            &buf
        }
    };
    let w: [u64; 8] = core::array::from_fn(|k| word(src, k));
    // A window declined here is rare: most are declined on their first 16 bytes above.
    if w.iter().fold(0, |h, &x| h | x) & HI != 0 {
        let first = w.iter().position(|&x| x & HI != 0).unwrap_or(0);
        let h = w.get(first).copied().unwrap_or(0) & HI;
        return Step::Declined {
            until: i + 8 * first + (h.trailing_zeros() / 8) as usize + WINDOW,
        };
    }
    let classes = Classes::of(w);
    let len = rest.len().min(WINDOW);
    // The class of the byte before the window, as far as the first piece cares.
    let before = i
        .checked_sub(1)
        .and_then(|k| bytes.get(k))
        .copied()
        .unwrap_or(0);
    let before = Before {
        after_punct,
        letter: before.is_ascii_alphabetic(),
        digit: before.is_ascii_digit(),
        newline: before == b'\n' || before == b'\r',
        space: before == b' ',
        punct: punct_before(bytes, i),
    };
    match count(&classes, src, rest, len == rest.len(), before, t) {
        Some((end, single, prose)) => Step::Counted {
            next: i + end,
            after_punct: single,
            prose,
        },
        None => declined,
    }
}

/// How many of the bytes of `src` at the bits of `at` (none at bit 0) differ from the byte before,
/// and how many of those the byte after repeats where `same` (the bytes of the same run) has it.
#[inline(never)]
fn mixed(src: &[u8; WINDOW], mut at: u64, same: u64) -> (u64, u64) {
    let (mut mix, mut repeat) = (0, 0);
    while at != 0 {
        let k = at.trailing_zeros() as usize;
        at &= at - 1;
        let (prev, c, next) = (src.get(k.wrapping_sub(1)), src.get(k), src.get(k + 1));
        if prev != c {
            mix += 1;
            repeat += u64::from(next == c && (same >> (k + 1)) & 1 != 0);
        }
    }
    (mix, repeat)
}

/// Whether `bytes` looks mostly ASCII where windows can read it: of up to 16 windows spread evenly
/// over it, at least seven in 16 are ASCII (a guess either way costs speed, never correctness). Text
/// with a non-ASCII word every few (a table with accented cells, European languages) has few such
/// windows and would have most windows declined or slow; text in long runs of ASCII and of other
/// scripts (junk, code among prose in other languages) has them and gains.
#[inline(always)]
pub(super) fn mostly(bytes: &[u8]) -> bool {
    let windows = bytes.len() / WINDOW;
    let samples = windows.min(16);
    // Sample `k` is window `k * windows / samples`: `k` itself where there are at most 16 windows
    // (every window), `k * windows / 16` (a shift) where there are more; no division.
    let ascii = if windows <= 16 {
        bytes
            .chunks_exact(WINDOW)
            .filter(|w| ascii_window(w))
            .count()
    } else {
        (0..16)
            .filter(|&k| {
                let at = ((k * windows) >> 4) * WINDOW;
                bytes.get(at..at + WINDOW).is_some_and(ascii_window)
            })
            .count()
    };
    ascii * 16 >= samples * 7 && samples > 0
}

/// Whether the 64 bytes of `w` (a window's) are all ASCII: their eight words ORed, one test.
#[inline(always)]
fn ascii_window(w: &[u8]) -> bool {
    <&[u8; WINDOW]>::try_from(w).is_ok_and(|w| (0..8).fold(0, |h, k| h | word(w, k)) & HI == 0)
}

/// The words of five letters or more at the bits of `five` (their ends at those of `word_end`) that
/// the table knows (see `words.rs`): counts them, after a space (`blank_prev`) and not, and the
/// rare letter pairs of the others that have at most one capital (of `upper`); returns the known
/// words' starts and their letters. Out of line: its loop has the registers to itself.
#[inline(never)]
fn known_words(
    rest: &[u8],
    five: u64,
    word_end: u64,
    blank_prev: u64,
    upper: u64,
    t: &mut Tally,
) -> (u64, u64) {
    let (mut starts, mut spans) = (0u64, 0u64);
    let (mut n, mut spaced, mut rare) = (0u64, 0u64, 0u64);
    let mut at = five;
    while at != 0 {
        let first = at.trailing_zeros();
        at &= at - 1;
        let len = (word_end >> first).trailing_zeros() + 1;
        let space = (blank_prev >> first) & 1 != 0;
        let span = (u64::MAX >> (64 - len)) << first;
        let (from, len) = (first as usize, len as usize);
        if known(rest, from, from + len, space) {
            starts |= 1 << first;
            spans |= span;
            n += 1;
            spaced += u64::from(space);
        } else if (upper & span) & (upper & span).wrapping_sub(1) == 0 || upper & span == span {
            // At most one capital, or all capitals (random ones: about a token for two letters).
            rare += rare_pairs(rest, from, from + len);
        }
    }
    let [known_space, known_bare] = &mut t.known;
    *known_space += spaced;
    *known_bare += n - spaced;
    t.rare_pairs += rare;
    (starts, spans)
}

/// How many of the lower-case words of `LEN` (three or four) letters at the bits of `at` are not
/// an o200k token after a space (see `short_known` in `words.rs`). Out of line, as [`known_words`].
#[inline(never)]
fn short_words<const LEN: usize>(rest: &[u8], mut at: u64) -> u64 {
    let mut n = 0u64;
    while at != 0 {
        let first = at.trailing_zeros() as usize;
        at &= at - 1;
        n += u64::from(!short_known(load(rest, first), LEN));
    }
    n
}

/// The rare letter pairs of the all-capital words of three or four letters at the bits of `at`
/// (their ends at those of `word_end`; random capitals are about a token for two letters).
#[inline(never)]
fn caps_pairs(rest: &[u8], mut at: u64, word_end: u64) -> u64 {
    let mut n = 0u64;
    while at != 0 {
        let first = at.trailing_zeros();
        at &= at - 1;
        let len = (word_end >> first).trailing_zeros() + 1;
        n += rare_pairs(rest, first as usize, (first + len) as usize);
    }
    n
}

/// What the piece before a window was, as far as the window's first piece cares.
#[derive(Clone, Copy)]
struct Before {
    /// A single punctuation character.
    after_punct: bool,
    /// Its last byte is an ASCII letter.
    letter: bool,
    /// Its last byte is an ASCII digit.
    digit: bool,
    /// Its last byte is LF or CR.
    newline: bool,
    /// Its last byte is a space.
    space: bool,
    /// It ends in punctuation or a symbol (see `punct_before`).
    punct: bool,
}

/// The counting part of [`window`], on the classes of its first `len` bytes (of `src`, the first
/// bytes of `rest`, the text from the window on).
#[inline(always)]
fn count(
    classes: &Classes,
    src: &[u8; WINDOW],
    rest: &[u8],
    end_of_text: bool,
    before: Before,
    t: &mut Tally,
) -> Option<(usize, bool, bool)> {
    let Before {
        after_punct,
        letter: letter_before,
        digit: digit_before,
        newline: newline_before,
        space: space_before,
        punct: punct_before,
    } = before;
    let len = rest.len().min(WINDOW);
    let valid = u64::MAX >> (WINDOW - len);
    let lower = classes.lower & valid;
    let upper = classes.upper & valid;
    let digit = classes.digit & valid;
    let space = classes.space & valid;
    let newline = classes.newline & valid;
    let control = classes.control & valid;
    let tabs = classes.tab & valid;
    let punct = valid & !(lower | upper | digit | space | newline | control);
    let letter = lower | upper;

    // Words: a run of upper case then lower case letters ("HTTPServer", "camel" + "Case").
    let word_start = (letter & !(letter << 1)) | (upper & (lower << 1));
    let word_end = (letter & !(letter >> 1)) | (lower & (upper >> 1));
    let digit_start = digit & !(digit << 1);
    let punct_start = punct & !(punct << 1);
    let newline_start = newline & !(newline << 1);
    let starts =
        word_start | digit_start | punct_start | (space & !(space << 1)) | newline_start | control;
    // Pieces counted: all at the end of the text, else all but the last.
    let (counted, end) = if end_of_text {
        (valid, len)
    } else {
        let zeros = starts.leading_zeros() as usize;
        if zeros >= 63 {
            return None;
        }
        let last = 63 - zeros;
        (u64::MAX >> (64 - last), last)
    };

    // The last space of a run before a digit; of a run of two or more not before a line break or
    // the end of the text.
    let last_space = space & !(space >> 1);
    let before_end = if end_of_text { 1u64 << (len - 1) } else { 0 };
    // Spaces (not tabs).
    let blank = space & !tabs;
    // Words right after a single punctuation character that no space comes before (the first one:
    // after the piece before).
    let single_punct_before =
        (punct << 1) & !(punct << 2) & !(blank << 2) & !(u64::from(space_before) << 1);
    // A word of at least `k` letters goes on over the `k - 1` bytes after its start; `five`: the
    // starts of the words of five letters or more.
    let go_on = letter & !word_start;
    let five = word_start & counted & (go_on >> 1) & (go_on >> 2) & (go_on >> 3) & (go_on >> 4);
    // Words of five letters or more that the table knows (see `words.rs`): counted as such, and left
    // out of the masks of word lengths, capitals and long letters below.
    // Spaces before each byte (bit 0: the byte before the window).
    let blank_prev = (blank << 1) | u64::from(space_before);
    // Words of three or four letters: asked of the table of o200k's short words.
    let three = word_start & counted & (go_on >> 1) & (go_on >> 2) & !five;
    if three != 0 {
        let four = three & (go_on >> 3);
        let caps3 = upper & (upper >> 1) & (upper >> 2);
        let caps = (three & !four & caps3) | (four & caps3 & (upper >> 3));
        if caps != 0 {
            t.rare_pairs += caps_pairs(rest, caps, word_end);
        }
        // Lower-case ones, as `short_unknown` in `latin.rs` asks them: the first few, all once two
        // were not tokens.
        if t.short_asked < SHORT_PROBES || t.short_unknown >= 2 {
            let lower3 = !(upper | (upper >> 1) | (upper >> 2));
            // Not next to a digit: letters between digits (hex, base64) are costed by their
            // switches.
            let lower3 = lower3 & !(digit << 1);
            let (three, four) = (
                three & !four & lower3 & !(digit >> 3),
                four & lower3 & !(upper >> 3) & !(digit >> 4),
            );
            t.short_asked += u64::from((three | four).count_ones());
            t.short_unknown += short_words::<3>(rest, three) + short_words::<4>(rest, four);
        }
    }
    let (known_starts, known_spans) = if five != 0 {
        known_words(rest, five, word_end, blank_prev, upper, t)
    } else {
        (0, 0)
    };
    // The starts of the words of at least `k` letters but the known ones (`at_least[k - 1]`, up
    // to 11).
    let mut at_least = [0u64; 11];
    let mut r = word_start & counted & !known_starts;
    for (k, slot) in at_least.iter_mut().enumerate() {
        *slot = r;
        r &= go_on >> (k + 1);
    }
    let [r1, r2, r3, r4, r5, r6, r7, r8, r9, _, r11] = at_least;
    // Letters and digits before each byte (bit 0: the byte before the window).
    let letter_prev = (letter << 1) | u64::from(letter_before);
    let digit_prev = (digit << 1) | u64::from(digit_before);
    // Punctuation before each byte: line breaks right after it belong to its piece.
    let punct_prev = (punct << 1) | u64::from(punct_before);
    t.punct_newlines += u64::from((newline_start & punct_prev & counted).count_ones());
    // In the order of `Tally::n`.
    let masks = [
        punct & counted,
        punct_start & counted,
        newline_start & !punct_prev & counted,
        control & counted,
        upper & !known_spans & counted,
        last_space & blank & (digit >> 1) & counted,
        last_space & (space << 1) & !(newline >> 1) & !before_end & counted,
        word_start & single_punct_before & counted,
        r1,
        r2,
        r3,
        r4,
        r5,
        r6,
        r7,
        r8,
        r9,
        r11,
        word_start & letter_prev & counted,
        ((word_start & digit_prev) | (digit_start & letter_prev)) & counted,
    ];
    // Population counts of all the masks at once (compilers vectorize this).
    let mut n = [0u64; 20];
    for (c, m) in n.iter_mut().zip(masks) {
        *c = u64::from(m.count_ones());
    }
    let [_, runs, ..] = n;
    let newlines = (newline_start & counted) != 0;
    if let Some(punct_words) = n.get_mut(7) {
        *punct_words += u64::from(after_punct && word_start & 1 != 0);
    }
    for (sum, c) in t.n.iter_mut().zip(n) {
        *sum += c;
    }

    // Rarer: letters of long words; all-capital words of two letters or more; digit groups.
    let ends = word_end & counted;
    let mut long = r11;
    while long != 0 {
        let first = long.trailing_zeros();
        long &= long - 1;
        let last = (ends & (u64::MAX << first)).trailing_zeros();
        let len = last - first + 1;
        t.long_letters += u64::from(len);
        t.over_20 += u64::from(u64::from(len) > super::bytes::EXCESS_FROM);
    }
    let mut caps = ends & upper & go_on;
    while caps != 0 {
        let last = caps.trailing_zeros();
        caps &= caps - 1;
        // The word's start: the last one up to its end (there is one).
        let first = 63u32.saturating_sub((word_start & (u64::MAX >> (63 - last))).leading_zeros());
        if (known_starts >> first) & 1 == 0 {
            t.caps_letters += u64::from(last - first + 1);
        }
    }
    if digit != 0 {
        let (mut starts, mut ends) = (digit_start & counted, digit & !(digit >> 1) & counted);
        let mut groups = 0u64;
        while starts != 0 {
            let n = u64::from(ends.trailing_zeros() - starts.trailing_zeros() + 1);
            starts &= starts - 1;
            ends &= ends - 1;
            groups += n.div_ceil(3);
        }
        t.digit_groups += groups;
    }

    // Mixed punctuation runs: characters from the fourth of a run on that differ from the one before.
    let deep = punct & (punct << 1) & (punct << 2) & (punct << 3) & counted;
    if deep != 0 {
        let (mix, repeat) = mixed(src, deep, punct & valid);
        t.punct_mix += mix;
        t.punct_repeat += repeat;
    }
    // Newline runs of 16 or more: bit `k` of `long` is set iff bytes `k..k + 16` are line breaks.
    let mut long = newline & (newline >> 1);
    long &= long >> 2;
    long &= long >> 4;
    long &= long >> 8;
    let mut long_starts = long & newline_start & counted;
    while long_starts != 0 {
        let first = long_starts.trailing_zeros();
        long_starts &= long_starts - 1;
        t.newline_16 += u64::from((newline >> first).trailing_ones() / 16);
    }

    // Tabs in the counted pieces (see `count_tabs`): runs of spaces and tabs that start a line
    // (indentation) are filled from their first byte on, those before a line break or the end of
    // the text from their last byte back, doubling the reach each step.
    let tabs = tabs & counted;
    if tabs != 0 {
        t.tab_words += u64::from((tabs & (letter >> 1)).count_ones());
        let (mut ahead, mut back) = (space, space);
        let mut indent = space & !(space << 1) & ((newline << 1) | u64::from(newline_before));
        let mut before_newline = last_space & ((newline >> 1) | before_end);
        for shift in [1, 2, 4, 8, 16, 32] {
            indent |= (indent << shift) & ahead;
            ahead &= ahead << shift;
            before_newline |= (before_newline >> shift) & back;
            back &= back >> shift;
        }
        let tabs_in = tabs & !before_newline;
        t.indent_tabs += u64::from((tabs_in & indent).count_ones());
        // Runs of tabs (a tab after a tab is in the counted part too, or is not a tab).
        t.tabs += u64::from((tabs_in & !(tabs << 1) & !indent).count_ones());
        // One per 16 tabs of each run (rare: runs of 16 or more).
        let mut long = tabs & (tabs >> 1);
        long &= long >> 2;
        long &= long >> 4;
        long &= long >> 8;
        let mut long_starts = long & !(tabs << 1);
        while long_starts != 0 {
            let first = long_starts.trailing_zeros();
            long_starts &= long_starts - 1;
            t.tabs += u64::from((tabs >> first).trailing_ones() / 16);
        }
    }

    // Whether the piece before `end` is a single punctuation character.
    let single = end < 64 && (single_punct_before >> end) & 1 != 0;
    Some((end, single, runs <= 2 && !newlines && digit == 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The classes of one byte, as `Classes` has them: lower, upper, digit, space or tab, LF or CR,
    /// other control or DEL, tab.
    fn class_of(b: u8) -> [bool; 7] {
        [
            b.is_ascii_lowercase(),
            b.is_ascii_uppercase(),
            b.is_ascii_digit(),
            b == b' ' || b == b'\t',
            b == b'\n' || b == b'\r',
            (b < 0x20 && b != b'\t' && b != b'\n' && b != b'\r') || b == 0x7F,
            b == b'\t',
        ]
    }

    #[test]
    fn classes_of_every_ascii_byte_at_every_position() {
        // Windows whose byte `k` is `(k * step + shift) % 128`: every byte value at many positions.
        for step in [1u32, 3, 5, 7, 11, 13, 17, 29, 31, 37, 61, 63, 127] {
            for shift in 0..128u32 {
                let src: [u8; WINDOW] =
                    core::array::from_fn(|k| ((k as u32 * step + shift) % 128) as u8);
                let c = Classes::of(core::array::from_fn(|k| word(&src, k)));
                let masks = [
                    c.lower, c.upper, c.digit, c.space, c.newline, c.control, c.tab,
                ];
                for (k, &b) in src.iter().enumerate() {
                    let got = masks.map(|m| (m >> k) & 1 != 0);
                    assert_eq!(got, class_of(b), "byte {b:#04x} at {k}");
                }
            }
        }
    }
}
