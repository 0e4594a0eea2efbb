//! Which o200k_base tokens the estimator's word table holds (shared by `examples/gen-word-table.rs`,
//! which writes the table, and the estimator's tests, which check it against the vocabulary).
//!
//! A token is taken when it is a word the estimator looks up (see `src/estimate/words.rs`) — with
//! one leading space or none — and its rank is below the limit of its group. o200k's ranks are the
//! order of its merges, so a low rank is a frequent word; the limits trade coverage for size.
#![allow(dead_code)]

/// The kind of word, as the estimator's scanner reads it.
#[derive(Clone, Copy, PartialEq, Eq, Debug, PartialOrd, Ord)]
pub enum Script {
    /// Plain ASCII letters: capitals then lower case (`Word`, `word`, `WORD`, `IOException`), at
    /// least `MIN_ASCII` of them.
    Ascii,
    /// ASCII capitals, then lower-case and accented Latin letters, at least one accented (`été`,
    /// `Über`, `người`), two letters or more.
    Latin,
    /// Letters of one alphabetic run (Cyrillic, Hebrew, Arabic, Indic), two or more.
    Alpha,
    /// Greek letters (U+0370..=U+03FF), two or more: like [`Script::Alpha`], and without a space
    /// too (the estimator reads an unknown Greek word as two tokens of the table, see
    /// `greek_pieces` in `src/estimate/scripts.rs`).
    Greek,
    /// Three or four Thai characters, without a space (for the estimator's greedy Thai tokens; the
    /// Thai pairs are bitmaps, see [`thai_pairs`]).
    Thai,
    /// Two to ten katakana (U+30A0..=U+30FF), loanwords.
    Kata,
}

/// Rank limits per group: (script, with a leading space, tokens of lower rank taken).
///
/// Measured on the corpus (sum over classes of the worse split's p95, each variant refitted): taking
/// words without a space of the alphabetic scripts (mostly fragments of longer words) or of accented
/// Latin, or all bare ASCII words, gains nothing; plain ASCII words after a space beyond rank 50,000
/// gain nothing measurable; alphabetic-script words after a space only up to rank 120,000 cost Arabic
/// and Hindi 3 to 5 points of p95. The limits keep the table (and the code that reads it) within
/// 64 KB of the `.wasm`.
pub const LIMITS: &[(Script, bool, u32)] = &[
    (Script::Ascii, true, 55_000),
    (Script::Ascii, false, 40_000),
    (Script::Latin, true, 200_000),
    (Script::Latin, false, 0),
    (Script::Alpha, true, 200_000),
    (Script::Alpha, false, 0),
    (Script::Greek, true, 200_000),
    (Script::Greek, false, 200_000),
    (Script::Thai, false, 200_000),
    (Script::Kata, false, 200_000),
    (Script::Kata, true, 200_000),
];

/// Longest word in bytes (`MAX_WORD` in `src/estimate/words.rs`).
pub const MAX_WORD: usize = 32;
/// Fewest letters of a plain ASCII word (`MIN_ASCII` there).
pub const MIN_ASCII: usize = 5;

/// An accented Latin letter as the scanner has it (`is_latin_ext` in `src/estimate/text.rs`).
fn latin_ext(c: char) -> bool {
    matches!(u32::from(c), 0xC0..=0xD6 | 0xD8..=0xF6 | 0xF8..=0x2AF | 0x1E00..=0x1EFF)
}

/// A letter of the alphabetic scripts' tight loop (`alpha_at` in `src/estimate/scripts.rs`).
fn alpha(c: char) -> bool {
    matches!(
        u32::from(c),
        0x370..=0x3FF | 0x400..=0x52F | 0x590..=0x5FF | 0x600..=0x6FF | 0x750..=0x77F | 0x900..=0xDFF
    )
}

/// A character of the Thai block, as the estimator's Thai runs have them (U+0E00..=U+0E5F: the
/// codes of its pair bitmaps).
pub fn thai(c: char) -> bool {
    (0xE00..0xE00 + THAI_CODES).contains(&u32::from(c))
}

/// Thai characters the pair bitmaps cover (codes 0..96 from U+0E00).
pub const THAI_CODES: u32 = 96;

/// The kind of `word` (without its leading space), if the estimator looks it up.
pub fn script(word: &str) -> Option<Script> {
    if word.is_empty() || word.len() > MAX_WORD {
        return None;
    }
    let chars: Vec<char> = word.chars().collect();
    if chars.iter().all(|&c| thai(c)) {
        return (3..=4).contains(&chars.len()).then_some(Script::Thai);
    }
    if chars
        .iter()
        .all(|&c| ('\u{30A0}'..='\u{30FF}').contains(&c))
    {
        return (chars.len() >= 2).then_some(Script::Kata);
    }
    if chars.iter().all(|&c| ('\u{370}'..='\u{3FF}').contains(&c)) {
        return (chars.len() >= 2).then_some(Script::Greek);
    }
    if chars.iter().all(|&c| alpha(c)) {
        return (chars.len() >= 2).then_some(Script::Alpha);
    }
    // Capitals, then lower case (accented letters count as lower case).
    let caps = chars.iter().take_while(|c| c.is_ascii_uppercase()).count();
    let rest = &chars[caps..];
    if !rest.iter().all(|&c| c.is_ascii_lowercase() || latin_ext(c)) {
        return None;
    }
    if rest.iter().any(|&c| latin_ext(c)) {
        return (chars.len() >= 2).then_some(Script::Latin);
    }
    (chars.len() >= MIN_ASCII).then_some(Script::Ascii)
}

/// The rank limit of a group: [`LIMITS`], or `WORD_LIMITS` in the environment (to try others:
/// `WORD_LIMITS=Ascii:true:60000,Alpha:false:0`).
pub fn limit(script: Script, space: bool) -> u32 {
    let over = std::env::var("WORD_LIMITS").unwrap_or_default();
    for item in over.split(',') {
        let mut it = item.split(':');
        if let (Some(s), Some(sp), Some(n)) = (it.next(), it.next(), it.next()) {
            if s == format!("{script:?}") && sp == space.to_string() {
                if let Ok(n) = n.parse() {
                    return n;
                }
            }
        }
    }
    LIMITS
        .iter()
        .find(|(s, sp, _)| *s == script && *sp == space)
        .map_or(0, |l| l.2)
}

/// The Thai pair bitmaps (bit `96 a + b` for the pair of codes `a`, `b`): pairs that are an o200k
/// token without a space; pairs that begin a Thai word of the table (three or four characters);
/// pairs that are its second and third characters; pairs that are the third and fourth of a word of
/// four (the last two only let the estimator skip lookups that cannot succeed).
pub fn thai_pairs(bpe: &tiktoken_rs::CoreBPE, entries: &[Entry]) -> [[u64; 144]; 4] {
    let code = |c: char| u32::from(c) - 0xE00;
    let set = |bits: &mut [u64; 144], a: u32, b: u32| {
        let k = (a * THAI_CODES + b) as usize;
        bits[k / 64] |= 1 << (k % 64);
    };
    let (mut pair, mut prefix, mut mid, mut end4) =
        ([0u64; 144], [0u64; 144], [0u64; 144], [0u64; 144]);
    for rank in 0..200_000u32 {
        let Ok(bytes) = bpe.decode_bytes(&[rank]) else {
            continue;
        };
        let Ok(text) = String::from_utf8(bytes) else {
            continue;
        };
        let chars: Vec<char> = text.chars().collect();
        if let [a, b] = chars[..] {
            if thai(a) && thai(b) {
                set(&mut pair, code(a), code(b));
            }
        }
    }
    for e in entries.iter().filter(|e| e.script == Script::Thai) {
        let chars: Vec<char> = e.word.chars().collect();
        set(&mut prefix, code(chars[0]), code(chars[1]));
        set(&mut mid, code(chars[1]), code(chars[2]));
        if let [_, _, c, d] = chars[..] {
            set(&mut end4, code(c), code(d));
        }
    }
    [pair, prefix, mid, end4]
}

/// The kana pair bitmaps (bit `96 a + b` for the pair of codes `a`, `b` from U+3040 for hiragana,
/// from U+30A0 for katakana): pairs of hiragana, and pairs of katakana, that are an o200k token
/// without a space.
pub fn kana_pairs(bpe: &tiktoken_rs::CoreBPE) -> ([u64; 144], [u64; 144]) {
    let (mut hira, mut kata) = ([0u64; 144], [0u64; 144]);
    for rank in 0..200_000u32 {
        let Ok(bytes) = bpe.decode_bytes(&[rank]) else {
            continue;
        };
        let Ok(text) = String::from_utf8(bytes) else {
            continue;
        };
        let chars: Vec<u32> = text.chars().map(u32::from).collect();
        if let [a, b] = chars[..] {
            for (base, bits) in [(0x3040, &mut hira), (0x30A0, &mut kata)] {
                if (base..base + 96).contains(&a) && (base..base + 96).contains(&b) {
                    let k = ((a - base) * 96 + (b - base)) as usize;
                    bits[k / 64] |= 1 << (k % 64);
                }
            }
        }
    }
    (hira, kata)
}

/// Fewest o200k tokens of ASCII letters (two or more, with a leading space or not, case folded)
/// that hold a letter pair for it to count as common: the pairs below are rare ones (`qx`, `jz`,
/// `vk`: a random letter string has about one in three of them, a word of real text that the word
/// table does not know about one in 25 words).
pub const RARE_PAIR_TOKENS: u32 = 40;

/// The rare letter pairs of ASCII words (bit `b & 31` of row `a & 31` for the pair `a`, `b`, either
/// case): pairs that fewer than [`RARE_PAIR_TOKENS`] o200k tokens of ASCII letters hold. o200k must
/// split a word between letters that no token joins, and seldom joins the rare ones.
pub fn rare_pairs(bpe: &tiktoken_rs::CoreBPE) -> [u32; 32] {
    let mut count = [[0u32; 26]; 26];
    for rank in 0..200_000u32 {
        let Ok(bytes) = bpe.decode_bytes(&[rank]) else {
            continue;
        };
        let word = bytes.strip_prefix(b" ").unwrap_or(&bytes);
        if word.len() < 2 || !word.iter().all(u8::is_ascii_alphabetic) {
            continue;
        }
        for p in word.windows(2) {
            let (a, b) = (
                p[0].to_ascii_lowercase() - b'a',
                p[1].to_ascii_lowercase() - b'a',
            );
            count[a as usize][b as usize] += 1;
        }
    }
    let mut rare = [0u32; 32];
    for (row, counts) in rare.iter_mut().skip(1).zip(&count) {
        for (b, &n) in counts.iter().enumerate() {
            if n < RARE_PAIR_TOKENS {
                *row |= 1 << (b + 1);
            }
        }
    }
    rare
}

/// One word of the table.
pub struct Entry {
    pub rank: u32,
    pub space: bool,
    pub word: String,
    pub script: Script,
}

/// The words of the table, in rank order.
pub fn select(bpe: &tiktoken_rs::CoreBPE) -> Vec<Entry> {
    let mut out = Vec::new();
    for rank in 0..200_000u32 {
        let Ok(bytes) = bpe.decode_bytes(&[rank]) else {
            continue;
        };
        let Ok(text) = String::from_utf8(bytes) else {
            continue;
        };
        let (space, word) = match text.strip_prefix(' ') {
            Some(w) => (true, w),
            None => (false, text.as_str()),
        };
        let Some(script) = script(word) else {
            continue;
        };
        let limit = limit(script, space);
        if rank < limit {
            out.push(Entry {
                rank,
                space,
                word: word.to_string(),
                script,
            });
        }
    }
    out
}

/// The o200k tokens of a space and three or four lower-case ASCII letters (` the`, ` json`), as
/// the estimator reads them: the letters' bytes little-endian in a `u64` (see `short_known` in
/// `src/estimate/words.rs`).
pub fn short_words(bpe: &tiktoken_rs::CoreBPE) -> Vec<u64> {
    let mut out = Vec::new();
    for rank in 0..200_000u32 {
        let Ok(bytes) = bpe.decode_bytes(&[rank]) else {
            continue;
        };
        let Some(word) = bytes.strip_prefix(b" ") else {
            continue;
        };
        if (3..=4).contains(&word.len()) && word.iter().all(u8::is_ascii_lowercase) {
            out.push(word.iter().rev().fold(0u64, |a, &b| a << 8 | u64::from(b)));
        }
    }
    out
}
