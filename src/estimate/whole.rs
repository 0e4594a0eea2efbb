//! The features of a whole text, read after the one pass of [`super::text`] ([`derive`]): the
//! text itself, and the letters of words longer than 20 letters and of random-case humps (a second
//! pass only when the loops saw such a word or many humps).

use super::bytes::{bump, letter_mask, not_lower_mask, Counts, EXCESS_FROM};
use super::weights::feature;

/// Letters beyond the 20th of every run of ASCII letters in `bytes`, a run ending at a non-letter or
/// where a capital follows a lower-case letter (`camelCase` words are pieces of their own in o200k):
/// eight bytes at a time.
pub(super) fn long_run_excess(bytes: &[u8]) -> u64 {
    const HI: u64 = 0x8080_8080_8080_8080;
    let (mut run, mut excess) = (0u64, 0u64);
    // High bit of byte 0 set iff the byte before the chunk was a lower-case letter.
    let mut lower_before = 0u64;
    // One chunk of eight bytes.
    let step = |w: u64, run: &mut u64, lower_before: &mut u64, excess: &mut u64| {
        let letter = letter_mask(w);
        let non_letter = !letter & HI;
        // A chunk whose last byte is not a letter, where the letters up to its first non-letter
        // close a run of at most `EXCESS_FROM` (humps or not, the run is no longer): no excess,
        // and the next chunk starts a run, after a byte that is not a lower-case letter (junk of
        // other scripts and symbols: most chunks). The humps are not read.
        if (non_letter >> 63) != 0
            && *run + u64::from(non_letter.trailing_zeros() / 8) <= EXCESS_FROM
        {
            (*run, *lower_before) = (0, 0);
            return;
        }
        let lower = !not_lower_mask(w) & HI;
        let hump = letter & !lower & ((lower << 8) | *lower_before);
        *lower_before = (lower >> 56) & 0x80;
        // Boundaries: non-letters, and capitals after a lower-case letter (counted as boundaries,
        // so the run after a hump starts one letter short: never more excess than there is).
        let m = non_letter | hump;
        if m == 0 {
            *run += 8;
            return;
        }
        *run += u64::from(m.trailing_zeros() / 8);
        *excess += run.saturating_sub(EXCESS_FROM);
        *run = u64::from(m.leading_zeros() / 8);
    };
    let word = |c: &[u8]| <[u8; 8]>::try_from(c).map_or(0, u64::from_le_bytes);
    // Sixteen bytes at a time; without an ASCII letter (other scripts, symbols), they end the run.
    let mut pairs = bytes.chunks_exact(16);
    for p in &mut pairs {
        let (w1, w2) = (
            word(p.get(..8).unwrap_or_default()),
            word(p.get(8..).unwrap_or_default()),
        );
        if letter_mask(w1) | letter_mask(w2) == 0 {
            excess += run.saturating_sub(EXCESS_FROM);
            (run, lower_before) = (0, 0);
            continue;
        }
        step(w1, &mut run, &mut lower_before, &mut excess);
        step(w2, &mut run, &mut lower_before, &mut excess);
    }
    let mut chunks = pairs.remainder().chunks_exact(8);
    for c in &mut chunks {
        step(word(c), &mut run, &mut lower_before, &mut excess);
    }
    let mut end = |run: u64| excess += run.saturating_sub(EXCESS_FROM);
    let mut was_lower = lower_before != 0;
    for &b in chunks.remainder() {
        let hump = was_lower && b.is_ascii_uppercase();
        was_lower = b.is_ascii_lowercase();
        if b.is_ascii_alphabetic() && !hump {
            run += 1;
        } else {
            end(run);
            run = 0;
        }
    }
    end(run);
    excess
}

/// A text with a hump at least every this many bytes is read for runs of random case
/// ([`mixed_case_humps`]).
const MIXED_HUMP_BYTES: u64 = 8;

/// Letters of a run of ASCII letters from which [`mixed_case_humps`] reads its case.
const MIXED_FROM: u32 = 3;

/// The humps (a capital after a lower-case letter) of the runs of ASCII letters of random case in
/// `bytes`: runs of at least [`MIXED_FROM`] letters whose lower-case stretches average under two and
/// a half letters (random case: 2; `camelCase` words have longer ones: `getUserName` 3, 3, 3), each
/// to cost
/// [`feature::WORD_EXCESS_LETTERS`]. o200k splits such runs at every hump as it does `camelCase`,
/// but random pieces take about 0.6 tokens a letter, not a token a piece.
pub(super) fn mixed_case_humps(bytes: &[u8]) -> u64 {
    const HI: u64 = 0x8080_8080_8080_8080;
    // The sum of the flags in the high bits of a chunk's bytes (one multiplication: each byte
    // 0 or 1, their sum, at most 8, in the top byte).
    let ones = |m: u64| ((m >> 7).wrapping_mul(0x0101_0101_0101_0101) >> 56) as u32;
    let mut run = HumpRun::default();
    let mut total = 0u64;
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let w = <[u8; 8]>::try_from(c).map_or(0, u64::from_le_bytes);
        if letter_mask(w) == HI {
            // Eight letters: the run goes on, its counts from the chunk's masks (what the steps a
            // byte at a time add; saturating sums add up the same in one).
            let lower = !not_lower_mask(w) & HI;
            let lower_before = (lower << 8) | (u64::from(run.was_lower) << 7);
            run.len = run.len.saturating_add(8);
            run.lower = run.lower.saturating_add(ones(lower));
            run.stretches = run.stretches.saturating_add(ones(lower & !lower_before));
            run.humps = run.humps.saturating_add(ones(!lower & HI & lower_before));
            run.was_lower = lower >> 63 != 0;
            continue;
        }
        for &b in c {
            run.step(b, &mut total);
        }
    }
    for &b in chunks.remainder().iter().chain(core::iter::once(&b' ')) {
        run.step(b, &mut total);
    }
    total
}

/// The run of ASCII letters [`mixed_case_humps`] is in: letters, lower-case letters, lower-case
/// stretches, humps, and whether the last byte was a lower-case letter.
#[derive(Default)]
struct HumpRun {
    len: u32,
    lower: u32,
    stretches: u32,
    humps: u32,
    was_lower: bool,
}

impl HumpRun {
    /// One byte: a letter goes on with the run; anything else ends it, adding its humps to `total`
    /// if it is of random case.
    #[inline(always)]
    fn step(&mut self, b: u8, total: &mut u64) {
        if b.is_ascii_lowercase() {
            if !self.was_lower {
                self.stretches = self.stretches.saturating_add(1);
            }
            self.lower = self.lower.saturating_add(1);
            self.len = self.len.saturating_add(1);
            self.was_lower = true;
        } else if b.is_ascii_uppercase() {
            if self.was_lower {
                self.humps = self.humps.saturating_add(1);
            }
            self.len = self.len.saturating_add(1);
            self.was_lower = false;
        } else {
            if self.len >= MIXED_FROM
                && self.lower.saturating_mul(2) < self.stretches.saturating_mul(5)
            {
                *total = total.saturating_add(u64::from(self.humps));
            }
            *self = HumpRun::default();
        }
    }
}

/// [`mixed_case_humps`] a byte at a time (as it was before round 5): the reference its
/// differential test compares it with.
#[cfg(test)]
pub(super) fn mixed_case_humps_plain(bytes: &[u8]) -> u64 {
    let mut run = HumpRun::default();
    let mut total = 0u64;
    for &b in bytes.iter().chain(core::iter::once(&b' ')) {
        run.step(b, &mut total);
    }
    total
}

/// The features that describe the whole text (of a non-empty text): [`feature::TEXT`], from the
/// counts of the others [`feature::CYRILLIC_UK_TEXT`] and [`feature::LATIN_EXT_A_TEXT`], and from
/// `bytes` [`feature::WORD_EXCESS_LETTERS`] (only when the loops saw a word of more than 20 letters).
#[inline(always)]
pub(super) fn derive(f: &mut Counts, bytes: &[u8]) {
    bump(f, feature::TEXT, 1);
    // The loops count the words of more than 20 letters there; only then are their letters counted.
    if let Some(excess) = f.get_mut(feature::WORD_EXCESS_LETTERS) {
        if *excess != 0 {
            *excess = long_run_excess(bytes);
        }
    }
    // Many humps (a capital after a letter): letters of random case, whose humps are charged too.
    let humps = f.get(feature::HUMP).copied().unwrap_or(0);
    if humps.saturating_mul(MIXED_HUMP_BYTES) >= bytes.len() as u64 {
        // A hump costs one and an eighth of `WORD_EXCESS_LETTERS` (0.62): random case in words of
        // 21–40 letters was 0.998× of o200k at one.
        let charged = mixed_case_humps(bytes);
        bump(
            f,
            feature::WORD_EXCESS_LETTERS,
            charged.saturating_add(charged / 8),
        );
    }
    let count = |f: &Counts, idx: usize| f.get(idx).copied().unwrap_or(0);
    let sum = |f: &Counts, from: usize, to: usize| {
        f.get(from..=to)
            .map_or(0, |w| w.iter().fold(0u64, |a, &b| a.saturating_add(b)))
    };
    let accented = count(f, feature::LATIN_EXT_A).saturating_add(count(f, feature::LATIN_EXT));
    let uk = count(f, feature::CYRILLIC_UK);
    if uk != 0 {
        let cyrillic = count(f, feature::CYRILLIC).saturating_add(uk);
        if uk.saturating_mul(40) >= cyrillic {
            bump(f, feature::CYRILLIC_UK_TEXT, cyrillic);
        }
    }
    if accented != 0 {
        let words = sum(f, feature::WORD_1, feature::WORD_LONG);
        if accented.saturating_mul(20) >= words {
            // The words of five letters or more that the word table does not know: rarer in o200k
            // than English ones of their length.
            let long = sum(f, feature::WORD_1 + 4, feature::WORD_LONG);
            bump(f, feature::LATIN_EXT_A_TEXT, long);
        }
    }
}
