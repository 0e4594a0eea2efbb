//! Character classes: which script or kind of character a code point is, and the per-character
//! features of the scripts with tables (Han, Hangul, Thai); UTF-8 decoding.

use super::tables::{HANGUL_COUNT, HANGUL_PACKED, HAN_COUNT, HAN_PACKED};
use super::weights::feature;

/// Character classes of non-ASCII code points (and, in [`ascii_cls`], of ASCII bytes).
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Cls {
    Lower,
    Upper,
    Digit,
    Space,
    Newline,
    Punct,
    LatinExt,
    Cyrillic,
    /// і ї є ґ (and capitals).
    CyrillicUk,
    Greek,
    Arabic,
    Hebrew,
    Indic,
    Thai,
    ThaiCommon,
    ThaiRare,
    Hiragana,
    Katakana,
    /// Half-width katakana (U+FF65..=U+FF9F).
    HalfwidthKana,
    Han,
    HanRare,
    HanMerge,
    Hangul,
    HangulRare,
    HangulMerge,
    WidePunct,
    Emoji,
    /// Zero-width and format characters.
    ZeroWidth,
    /// Symbols U+2000..=U+2BFF outside the punctuation block.
    Symbol,
    /// Any other character from U+0800 on.
    OtherWide,
    Other,
}

#[inline(always)]
pub(super) const fn ascii_cls(b: u8) -> Cls {
    if b.is_ascii_lowercase() {
        Cls::Lower
    } else if b.is_ascii_uppercase() {
        Cls::Upper
    } else if b.is_ascii_digit() {
        Cls::Digit
    } else if b == b'\n' || b == b'\r' {
        Cls::Newline
    } else if b == b' ' || b == b'\t' || b == 0x0b || b == 0x0c {
        Cls::Space
    } else if !matches!(b, 0x20..=0x7E) {
        Cls::Other
    } else {
        Cls::Punct
    }
}

/// Class of a non-ASCII code point: the scripts that make up long runs (Han, Hangul, Thai, kana) by one
/// range check and a table each, the rest by [`classify_other`].
#[inline(always)]
pub(super) fn classify(c: u32) -> Cls {
    let han = c.wrapping_sub(0x4E00);
    if han < HAN_COUNT {
        return match packed_class(&HAN_PACKED, han) {
            2 => Cls::HanMerge,
            1 => Cls::Han,
            _ => Cls::HanRare,
        };
    }
    let hangul = c.wrapping_sub(0xAC00);
    if hangul < HANGUL_COUNT {
        return match packed_class(&HANGUL_PACKED, hangul) {
            2 => Cls::HangulMerge,
            1 => Cls::Hangul,
            _ => Cls::HangulRare,
        };
    }
    let thai = c.wrapping_sub(0xE00);
    if thai < 0x80 {
        return thai_class(c);
    }
    // Below U+3000, a block of 16 code points of one class (most of them: symbols, punctuation,
    // the scripts without a run loop) by one load (the others by their row in `classify_other`).
    if let Some(&Some(cls)) = LOW_BLOCKS.get((c >> 4) as usize) {
        return cls;
    }
    match c {
        0x3001..=0x303F => Cls::WidePunct,
        0x3040..=0x309F => Cls::Hiragana,
        0x30A0..=0x30FF => Cls::Katakana,
        // Fullwidth punctuation (as in `classify_other`, without the digits and letters between).
        0xFF01..=0xFF0F | 0xFF1A..=0xFF20 | 0xFF3B..=0xFF40 | 0xFF5B..=0xFF64 => Cls::WidePunct,
        _ => classify_other(c),
    }
}

/// Class of any code point (the general case of [`classify`]).
#[inline(never)]
pub(super) fn classify_other(c: u32) -> Cls {
    // Below U+3000 by the tables: the block's class, or (a block of more than one class, where
    // `classify` sends them) its row.
    let block = (c >> 4) as usize;
    if let Some(&uniform) = LOW_BLOCKS.get(block) {
        if let Some(cls) = uniform {
            return cls;
        }
        if let Some(&cls) = LOW_ROW
            .get(block)
            .and_then(|&row| LOW_MIXED.get(usize::from(row)))
            .and_then(|row| row.get((c & 15) as usize))
        {
            return cls;
        }
    }
    // The commonest blocks of symbols and emoji first (junk, decorated text): what the general
    // case below says of them, in one range check each.
    if c.wrapping_sub(0x2070) <= 0x2BFF - 0x2070 {
        return Cls::Symbol;
    }
    if c.wrapping_sub(0x1F000) <= 0x1FAFF - 0x1F000 {
        return Cls::Emoji;
    }
    classify_general(c)
}

/// [`classify_other`] without its shortcuts (the test that checks them compares with this).
#[inline(always)]
pub(super) fn classify_general(c: u32) -> Cls {
    match classify_block(c) {
        Cls::Other if c >= 0x800 => {
            if (0x2000..=0x2BFF).contains(&c) {
                Cls::Symbol
            } else {
                Cls::OtherWide
            }
        }
        cls => cls,
    }
}

/// Blocks of 16 code points below U+3000 (block `k`: U+`16k`..=U+`16k+15`).
const LOW_BLOCK_COUNT: usize = 0x300;

/// The class [`classify_general`] gives every code point of block `k` (see [`LOW_BLOCKS`]), or
/// None where they differ.
const fn uniform_block(k: usize) -> Option<Cls> {
    let first = general_low(16 * k as u32);
    let mut c = 16 * k as u32 + 1;
    while c < 16 * (k as u32 + 1) {
        if general_low(c) as u8 != first as u8 {
            return None;
        }
        c += 1;
    }
    Some(first)
}

/// [`uniform_block`] of every block below U+3000.
pub(super) static LOW_BLOCKS: [Option<Cls>; LOW_BLOCK_COUNT] = {
    let mut t = [None; LOW_BLOCK_COUNT];
    let mut k = 0;
    while k < t.len() {
        #[allow(clippy::indexing_slicing)] // compile time: out of range fails the build
        {
            t[k] = uniform_block(k);
        }
        k += 1;
    }
    t
};

/// Blocks below U+3000 of more than one class (ASCII, Latin-1, Ukrainian letters, Thai, general
/// punctuation: spaces, zero-width characters and line separators among it).
const MIXED_BLOCKS: usize = {
    let (mut n, mut k) = (0, 0);
    while k < LOW_BLOCK_COUNT {
        if uniform_block(k).is_none() {
            n += 1;
        }
        k += 1;
    }
    assert!(n <= 256, "a row index is a byte");
    n
};

/// The row in [`LOW_MIXED`] of each block of more than one class (0, unread, for the others).
static LOW_ROW: [u8; LOW_BLOCK_COUNT] = {
    let mut t = [0u8; LOW_BLOCK_COUNT];
    let (mut n, mut k) = (0, 0);
    while k < LOW_BLOCK_COUNT {
        if uniform_block(k).is_none() {
            #[allow(clippy::indexing_slicing)] // compile time: out of range fails the build
            {
                t[k] = n as u8;
            }
            n += 1;
        }
        k += 1;
    }
    t
};

/// [`classify_general`] of every code point of the blocks of more than one class, in their order.
static LOW_MIXED: [[Cls; 16]; MIXED_BLOCKS] = {
    let mut t = [[Cls::Other; 16]; MIXED_BLOCKS];
    let (mut n, mut k) = (0, 0);
    while k < LOW_BLOCK_COUNT {
        if uniform_block(k).is_none() {
            let mut j = 0;
            while j < 16 {
                #[allow(clippy::indexing_slicing)] // compile time: out of range fails the build
                {
                    t[n][j] = general_low((16 * k + j) as u32);
                }
                j += 1;
            }
            n += 1;
        }
        k += 1;
    }
    t
};

/// [`classify_general`] below U+3000.
const fn general_low(c: u32) -> Cls {
    match classify_low(c) {
        Cls::Other if c >= 0x800 => {
            if matches!(c, 0x2000..=0x2BFF) {
                Cls::Symbol
            } else {
                Cls::OtherWide
            }
        }
        cls => cls,
    }
}

/// [`classify_other`] by block, before characters from U+0800 on without a class are told apart.
#[inline(always)]
pub(super) fn classify_block(c: u32) -> Cls {
    // Nested ranges so that the common blocks are reached in a few comparisons.
    if c < 0x3000 {
        return classify_low(c);
    }
    classify_high(c)
}

/// [`classify_block`] below U+3000.
#[inline(always)]
const fn classify_low(c: u32) -> Cls {
    if c < 0x370 {
        return match c {
            0..=0x7F => ascii_cls((c & 0x7F) as u8),
            0xA0 => Cls::Space,
            0x85 => Cls::Newline,
            0xAD => Cls::ZeroWidth,
            0xD7 | 0xF7 => Cls::Other,
            0xC0..=0x2AF => Cls::LatinExt,
            _ => Cls::Other,
        };
    }
    if c < 0x1000 {
        return match c {
            0x370..=0x3FF => Cls::Greek,
            0x404 | 0x406 | 0x407 | 0x454 | 0x456 | 0x457 | 0x490 | 0x491 => Cls::CyrillicUk,
            0x400..=0x52F => Cls::Cyrillic,
            0x590..=0x5FF => Cls::Hebrew,
            0x600..=0x6FF | 0x750..=0x77F | 0x8A0..=0x8FF => Cls::Arabic,
            0x900..=0xDFF => Cls::Indic,
            0xE00..=0xE7F => thai_class_slow(c),
            _ => Cls::Other,
        };
    }
    match c {
        0x1100..=0x11FF => Cls::HangulRare,
        0x1E00..=0x1EFF => Cls::LatinExt,
        0x1F00..=0x1FFF => Cls::Greek,
        0x2000..=0x200A | 0x202F | 0x205F => Cls::Space,
        0x200B..=0x200F | 0x202A..=0x202E | 0x2060..=0x206F => Cls::ZeroWidth,
        0x2028 | 0x2029 => Cls::Newline,
        0x2010..=0x206F => Cls::Punct,
        _ => Cls::Other,
    }
}

/// [`classify_block`] from U+3000 on.
#[inline(always)]
fn classify_high(c: u32) -> Cls {
    if c < 0xA000 {
        return match c {
            0x4E00..=0x9FFF => classify(c),
            0x3000 => Cls::Space,
            0x3001..=0x303F => Cls::WidePunct,
            0x3040..=0x309F => Cls::Hiragana,
            0x30A0..=0x30FF | 0x31F0..=0x31FF => Cls::Katakana,
            0x3130..=0x318F => Cls::HangulRare,
            0x3400..=0x4DBF => Cls::HanRare,
            _ => Cls::Other,
        };
    }
    if c < 0x10000 {
        return match c {
            0xAC00..=0xD7A3 => classify(c),
            0xA960..=0xA97F | 0xD7A4..=0xD7FF => Cls::HangulRare,
            0xF900..=0xFAFF => Cls::HanRare,
            0xFE00..=0xFE0F | 0xFEFF => Cls::ZeroWidth,
            0xFB1D..=0xFB4F => Cls::Hebrew,
            0xFB50..=0xFDFF | 0xFE70..=0xFEFE => Cls::Arabic,
            0xFF10..=0xFF19 => Cls::Digit,
            0xFF21..=0xFF3A | 0xFF41..=0xFF5A => Cls::Han,
            0xFF01..=0xFF64 => Cls::WidePunct,
            0xFF65..=0xFF9F => Cls::HalfwidthKana,
            _ => Cls::Other,
        };
    }
    match c {
        0x1F000..=0x1FAFF => Cls::Emoji,
        0x20000..=0x3FFFF => Cls::HanRare,
        _ => Cls::Other,
    }
}

/// Thai, by how many multi-character o200k tokens contain the character (vocabulary scan):
/// ≥ 150: า น ร เ อ ่ ม ั ง ล ก ย ิ ี ต ด ว; 50..150: ้ ส ค ท บ ห ์ ุ แ พ ป จ ไ ็ ะ ข โ ื; the rest fewer.
#[inline(always)]
pub(super) fn thai_class(c: u32) -> Cls {
    THAI_TABLE
        .get(c.wrapping_sub(0xE00) as usize)
        .copied()
        .unwrap_or(Cls::ThaiRare)
}

/// [`thai_class_slow`] for U+0E00..=U+0E7F.
pub(super) static THAI_TABLE: [Cls; 0x80] = {
    let mut t = [Cls::ThaiRare; 0x80];
    let mut i = 0;
    while i < 0x80 {
        #[allow(clippy::indexing_slicing)] // compile time: out of range fails the build
        {
            t[i] = thai_class_slow(0xE00 + i as u32);
        }
        i += 1;
    }
    t
};

pub(super) const fn thai_class_slow(c: u32) -> Cls {
    match c {
        0xE32 | 0xE19 | 0xE23 | 0xE40 | 0xE2D | 0xE48 | 0xE21 | 0xE31 | 0xE07 | 0xE25 | 0xE01
        | 0xE22 | 0xE34 | 0xE35 | 0xE15 | 0xE14 | 0xE27 => Cls::ThaiCommon,
        0xE49 | 0xE2A | 0xE04 | 0xE17 | 0xE1A | 0xE2B | 0xE4C | 0xE38 | 0xE41 | 0xE1E | 0xE1B
        | 0xE08 | 0xE44 | 0xE47 | 0xE30 | 0xE02 | 0xE42 | 0xE37 => Cls::Thai,
        _ => Cls::ThaiRare,
    }
}

/// Which run a class belongs to (consecutive characters of one run form one pre-token piece).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Run {
    Alpha,
    Thai,
    Cjk,
    Hangul,
}

#[inline]
pub(super) fn run_of(c: Cls) -> Option<Run> {
    match c {
        Cls::Cyrillic | Cls::CyrillicUk | Cls::Greek | Cls::Arabic | Cls::Hebrew | Cls::Indic => {
            Some(Run::Alpha)
        }
        Cls::Thai | Cls::ThaiCommon | Cls::ThaiRare => Some(Run::Thai),
        Cls::Hiragana | Cls::Katakana | Cls::Han | Cls::HanRare | Cls::HanMerge => Some(Run::Cjk),
        Cls::Hangul | Cls::HangulRare | Cls::HangulMerge => Some(Run::Hangul),
        _ => None,
    }
}

/// Every class, in the order of their discriminants (the build checks it).
const ALL_CLS: [Cls; 31] = [
    Cls::Lower,
    Cls::Upper,
    Cls::Digit,
    Cls::Space,
    Cls::Newline,
    Cls::Punct,
    Cls::LatinExt,
    Cls::Cyrillic,
    Cls::CyrillicUk,
    Cls::Greek,
    Cls::Arabic,
    Cls::Hebrew,
    Cls::Indic,
    Cls::Thai,
    Cls::ThaiCommon,
    Cls::ThaiRare,
    Cls::Hiragana,
    Cls::Katakana,
    Cls::HalfwidthKana,
    Cls::Han,
    Cls::HanRare,
    Cls::HanMerge,
    Cls::Hangul,
    Cls::HangulRare,
    Cls::HangulMerge,
    Cls::WidePunct,
    Cls::Emoji,
    Cls::ZeroWidth,
    Cls::Symbol,
    Cls::OtherWide,
    Cls::Other,
];

/// [`CHAR_FEATURE`]'s entry of a class without a per-character feature.
const NO_FEATURE: u8 = u8::MAX;

/// [`char_feature_of`] of every class by its discriminant ([`NO_FEATURE`] for None): a load
/// instead of a jump table's indirect branch.
static CHAR_FEATURE: [u8; ALL_CLS.len()] = {
    let mut t = [NO_FEATURE; ALL_CLS.len()];
    let mut i = 0;
    while i < t.len() {
        #[allow(clippy::indexing_slicing)] // compile time: out of range fails the build
        {
            assert!(ALL_CLS[i] as usize == i, "ALL_CLS out of order");
            if let Some(f) = char_feature_of(ALL_CLS[i]) {
                assert!(f < NO_FEATURE as usize, "feature index too large");
                t[i] = f as u8;
            }
        }
        i += 1;
    }
    t
};

/// Per-character feature of a script class (None for classes handled elsewhere).
#[inline(always)]
pub(super) fn char_feature(c: Cls) -> Option<usize> {
    match CHAR_FEATURE.get(c as usize) {
        Some(&f) if f != NO_FEATURE => Some(usize::from(f)),
        _ => None,
    }
}

/// [`char_feature`] by a `match` (what its table holds).
const fn char_feature_of(c: Cls) -> Option<usize> {
    Some(match c {
        Cls::LatinExt => feature::LATIN_EXT,
        Cls::Cyrillic => feature::CYRILLIC,
        Cls::CyrillicUk => feature::CYRILLIC_UK,
        Cls::Greek => feature::GREEK,
        Cls::Arabic => feature::ARABIC,
        Cls::Hebrew => feature::HEBREW,
        Cls::Indic => feature::INDIC,
        Cls::Thai => feature::THAI,
        Cls::ThaiCommon => feature::THAI_COMMON,
        Cls::ThaiRare => feature::THAI_RARE,
        Cls::Hiragana => feature::HIRAGANA,
        Cls::Katakana => feature::KATAKANA,
        Cls::HalfwidthKana => feature::HALFWIDTH_KANA,
        Cls::Han => feature::HAN,
        Cls::HanRare => feature::HAN_RARE,
        Cls::HanMerge => feature::HAN_MERGE,
        Cls::Hangul => feature::HANGUL,
        Cls::HangulRare => feature::HANGUL_RARE,
        Cls::HangulMerge => feature::HANGUL_MERGE,
        Cls::WidePunct => feature::WIDE_PUNCT,
        Cls::Emoji => feature::EMOJI,
        Cls::Other => feature::OTHER,
        Cls::ZeroWidth => feature::ZERO_WIDTH,
        Cls::Symbol => feature::SYMBOL,
        Cls::OtherWide => feature::OTHER_WIDE,
        Cls::Punct => feature::PUNCT,
        Cls::Lower | Cls::Upper | Cls::Digit | Cls::Space | Cls::Newline => return None,
    })
}

/// The feature that counts runs of alphabetic scripts, by the class of the run's first letter.
#[inline(always)]
pub(super) fn alpha_run_feature(cls: Cls) -> usize {
    match cls {
        Cls::Greek => feature::GREEK_RUNS,
        Cls::Arabic => feature::ARABIC_RUNS,
        Cls::Hebrew => feature::HEBREW_RUNS,
        Cls::Indic => feature::INDIC_RUNS,
        _ => feature::ALPHA_RUNS,
    }
}

/// Per-character feature of a CJK ideograph (index into [`HAN_PACKED`]).
#[inline(always)]
pub(super) fn han_feature(han: u32) -> usize {
    const BY_CLASS: [usize; 4] = [
        feature::HAN_RARE,
        feature::HAN,
        feature::HAN_MERGE,
        feature::HAN_RARE,
    ];
    let class = usize::from(packed_class(&HAN_PACKED, han));
    BY_CLASS.get(class).copied().unwrap_or(feature::HAN_RARE)
}

/// Per-character feature of a Hangul syllable (index into [`HANGUL_PACKED`]).
#[inline(always)]
pub(super) fn hangul_feature(hangul: u32) -> usize {
    const BY_CLASS: [usize; 4] = [
        feature::HANGUL_RARE,
        feature::HANGUL,
        feature::HANGUL_MERGE,
        feature::HANGUL_RARE,
    ];
    let class = usize::from(packed_class(&HANGUL_PACKED, hangul));
    BY_CLASS.get(class).copied().unwrap_or(feature::HANGUL_RARE)
}

/// Per-character feature of a Thai-block character (`thai` = code point − U+0E00, < 0x80).
#[inline(always)]
pub(super) fn thai_feature(thai: u32) -> usize {
    THAI_FEATURE
        .get(thai as usize)
        .map_or(feature::THAI_RARE, |&f| usize::from(f))
}

/// [`thai_class`] as a feature index, for U+0E00..=U+0E7F.
pub(super) static THAI_FEATURE: [u8; 0x80] = {
    let mut t = [0u8; 0x80];
    let mut i = 0;
    while i < 0x80 {
        let f = match thai_class_slow(0xE00 + i as u32) {
            Cls::ThaiCommon => feature::THAI_COMMON,
            Cls::Thai => feature::THAI,
            _ => feature::THAI_RARE,
        };
        #[allow(clippy::indexing_slicing)] // compile time: out of range fails the build
        {
            t[i] = f as u8;
        }
        i += 1;
    }
    t
};

/// The code point of a three-byte UTF-8 sequence (lead byte 0xE0..=0xEF).
#[inline(always)]
pub(super) fn cp3(b0: u8, b1: u8, b2: u8) -> u32 {
    (u32::from(b0 & 0x0F) << 12) | (u32::from(b1 & 0x3F) << 6) | u32::from(b2 & 0x3F)
}

/// The character at `j` if it is a valid three-byte sequence for U+1000..=U+D7FF (kana, ideographs,
/// Hangul; the lead bytes without an overlong or surrogate range of their own), else None.
#[inline(always)]
pub(super) fn plain_cp3(bytes: &[u8], j: usize) -> Option<u32> {
    match *bytes.get(j..)? {
        [b0 @ 0xE1..=0xEC, b1 @ 0x80..=0xBF, b2 @ 0x80..=0xBF, ..]
        | [b0 @ 0xED, b1 @ 0x80..=0x9F, b2 @ 0x80..=0xBF, ..] => Some(cp3(b0, b1, b2)),
        _ => None,
    }
}

/// The non-ASCII character starting at byte `i` and its length in bytes; None for ASCII, at the end, and
/// where `bytes` is not UTF-8 there (a continuation byte, a truncated sequence, an overlong encoding, a
/// surrogate or a code point above U+10FFFF: the checks of `std::str::from_utf8`).
#[inline(always)]
pub(super) fn decode(bytes: &[u8], i: usize) -> Option<(u32, usize)> {
    let cont = |b: u8| u32::from(b & 0x3F);
    match *bytes.get(i..)? {
        [b0 @ 0xC2..=0xDF, b1 @ 0x80..=0xBF, ..] => {
            Some(((u32::from(b0 & 0x1F) << 6) | cont(b1), 2))
        }
        [b0 @ 0xE0..=0xEF, b1 @ 0x80..=0xBF, b2 @ 0x80..=0xBF, ..] => {
            let cp = cp3(b0, b1, b2);
            (cp >= 0x800 && !(0xD800..=0xDFFF).contains(&cp)).then_some((cp, 3))
        }
        [b0 @ 0xF0..=0xF4, b1 @ 0x80..=0xBF, b2 @ 0x80..=0xBF, b3 @ 0x80..=0xBF, ..] => {
            let cp = (u32::from(b0 & 0x07) << 18) | (cont(b1) << 12) | (cont(b2) << 6) | cont(b3);
            (0x1_0000..=0x10_FFFF).contains(&cp).then_some((cp, 4))
        }
        _ => None,
    }
}

/// 2-bit class of entry `i` of a table packed four per byte (see [`HAN_PACKED`]); 0 past the end.
#[inline(always)]
pub(super) fn packed_class(table: &[u8], i: u32) -> u8 {
    let i = i as usize;
    table.get(i >> 2).map_or(0, |b| (b >> ((i & 3) * 2)) & 3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_and_its_block_table_agree_with_the_general_case() {
        // Every non-ASCII code point (`classify`'s callers decode UTF-8 first), through the
        // block table, the ranges before it and `classify_other`.
        for c in 0x80..=0x10FFFFu32 {
            assert!(
                classify(c) == classify_general(c),
                "U+{c:04X}: classify differs from classify_general"
            );
        }
        // Blocks of one class are most below U+3000 (symbols, scripts without a run loop).
        let uniform = LOW_BLOCKS.iter().filter(|b| b.is_some()).count();
        assert!(uniform > 0x280, "{uniform} uniform blocks");
        assert_eq!(uniform + MIXED_BLOCKS, LOW_BLOCK_COUNT);
    }

    #[test]
    fn the_per_character_feature_table_is_the_match() {
        for (i, &c) in ALL_CLS.iter().enumerate() {
            assert_eq!(c as usize, i);
            assert_eq!(char_feature(c), char_feature_of(c));
        }
        assert_eq!(char_feature(Cls::Symbol), Some(feature::SYMBOL));
        assert_eq!(char_feature(Cls::Lower), None);
    }
}
