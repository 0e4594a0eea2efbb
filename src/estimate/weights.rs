//! The features the text estimate counts and their weights (fitted against o200k_base).

/// Words of three or four letters of a text that are always asked of the short-word table (see
/// [`feature::SHORT_ASKED`]): random short words are not tokens 80–90 % of the time, real ones 1 %.
pub const SHORT_PROBES: u64 = 4;

/// Number of features [`text_features`](super::text_features) counts.
pub const NUM_FEATURES: usize = 84;
// `weighed` (text.rs) weighs the features four at a time.
const _: () = assert!(NUM_FEATURES.is_multiple_of(4));

/// Feature indices (documentation for the calibration program and [`WEIGHTS`]).
pub mod feature {
    /// ASCII letter words of length 1..=8 are features 0..=7 (index = length − 1).
    pub const WORD_1: usize = 0;
    /// ASCII letter words of length 9 or 10.
    pub const WORD_9_10: usize = 8;
    /// ASCII letter words of length ≥ 11 (count).
    pub const WORD_LONG: usize = 9;
    /// Letters in words of length ≥ 11.
    pub const WORD_LONG_CHARS: usize = 10;
    /// Accented / extended Latin letters (Latin-1 supplement, Latin Extended-A/B, IPA).
    pub const LATIN_EXT: usize = 11;
    /// Cyrillic letters.
    pub const CYRILLIC: usize = 12;
    /// Greek letters.
    pub const GREEK: usize = 13;
    /// Arabic letters.
    pub const ARABIC: usize = 14;
    /// Devanagari and other Indic letters.
    pub const INDIC: usize = 15;
    /// Runs of Cyrillic (≈ words; the other alphabetic scripts have their own run features).
    pub const ALPHA_RUNS: usize = 16;
    /// Thai characters that occur in 50..150 multi-character o200k tokens.
    pub const THAI: usize = 17;
    /// Runs of Thai characters.
    pub const THAI_RUNS: usize = 18;
    /// Hiragana.
    pub const HIRAGANA: usize = 19;
    /// Katakana (full and half width).
    pub const KATAKANA: usize = 20;
    /// CJK ideographs that are one o200k token alone but never merge with neighbours.
    pub const HAN: usize = 21;
    /// Runs of kana/ideographs.
    pub const CJK_RUNS: usize = 22;
    /// Hangul syllables that are one o200k token alone but never merge with neighbours.
    pub const HANGUL: usize = 23;
    /// Runs of Hangul.
    pub const HANGUL_RUNS: usize = 24;
    /// Digit groups (runs split into groups of up to 3).
    pub const DIGIT_GROUPS: usize = 25;
    /// ASCII punctuation characters.
    pub const PUNCT: usize = 26;
    /// Runs of ASCII punctuation.
    pub const PUNCT_RUNS: usize = 27;
    /// CJK / fullwidth punctuation characters.
    pub const WIDE_PUNCT: usize = 28;
    /// Emoji (U+1F000 and above).
    pub const EMOJI: usize = 29;
    /// Other symbols, combining marks and unclassified characters.
    pub const OTHER: usize = 30;
    /// Runs of newlines (with the spaces around them).
    pub const NEWLINE_RUNS: usize = 31;
    /// Runs of 2 or more spaces/tabs not touching a newline (indentation, alignment).
    pub const SPACE_RUNS: usize = 32;
    /// Spaces directly before a digit (o200k never merges a space into a number: a piece of its
    /// own; a tab there is counted as [`TAB`]).
    pub const SPACE_BEFORE_DIGIT: usize = 33;
    /// Upper-case ASCII letters (capitals and acronyms split more).
    pub const UPPER: usize = 34;
    /// Words right after a single punctuation character that no space comes before: o200k takes
    /// the character into the word's piece (`.split`, `"type`; but ` "` + `type`).
    pub const PUNCT_WORD: usize = 35;
    /// CJK ideographs that are not a token of their own (encoded as bytes, ~2 tokens each).
    pub const HAN_RARE: usize = 36;
    /// CJK ideographs that also occur inside multi-character tokens (common words merge).
    pub const HAN_MERGE: usize = 37;
    /// Hangul syllables and jamo that are not a token of their own.
    pub const HANGUL_RARE: usize = 38;
    /// Hangul syllables that also occur inside multi-character tokens.
    pub const HANGUL_MERGE: usize = 39;
    /// Thai characters that occur in ≥ 150 multi-character o200k tokens (merge most).
    pub const THAI_COMMON: usize = 40;
    /// Thai characters that occur in < 50 multi-character o200k tokens (merge least).
    pub const THAI_RARE: usize = 41;
    /// Letters of all-capital ASCII words of length ≥ 2 (acronyms, SQL keywords, CONSTANTS).
    pub const CAPS_WORD_CHARS: usize = 42;
    /// Maximal runs of katakana (loanwords, which o200k often has as whole tokens).
    pub const KATAKANA_RUNS: usize = 43;
    /// ASCII words that start right after an ASCII letter: camelCase humps (`getHttp` + `Response`),
    /// which have no space to merge into (prose words do).
    pub const HUMP: usize = 44;
    /// ASCII words right after an ASCII digit, and digit runs right after an ASCII letter (`x86`,
    /// `utf8`, base64, hex): switches between letters and digits inside one blob.
    pub const ALNUM_SWITCH: usize = 45;
    /// ASCII punctuation from the fourth character of a run on that differs from the character
    /// before it: mixed runs (`!?.,;:`) are about one token per two characters, repeats
    /// (`========`) one token for many.
    pub const PUNCT_MIX: usize = 46;
    /// Newline runs, one per 16 newlines (o200k merges up to about 16 line breaks into a token).
    pub const NEWLINE_16: usize = 47;
    /// Space/tab runs, one per 128 (o200k's longest whitespace tokens).
    pub const SPACE_128: usize = 48;
    /// Symbols U+2000..=U+2BFF outside the punctuation block (arrows, math, currency, box drawing).
    pub const SYMBOL: usize = 49;
    /// Zero-width and format characters (ZWSP, ZWJ, bidi marks, word joiner, BOM, soft hyphen).
    pub const ZERO_WIDTH: usize = 50;
    /// Runs of zero-width / format characters.
    pub const ZERO_WIDTH_RUNS: usize = 51;
    /// Hebrew letters.
    pub const HEBREW: usize = 52;
    /// Letters of an alphabetic-script run (Cyrillic, Greek, Arabic, Hebrew, Indic) past its 12th:
    /// long runs are not words, o200k splits them into short pieces.
    pub const ALPHA_LONG: usize = 53;
    /// Accented Latin letters right after another one in the same word (Vietnamese `ườ`, random
    /// accented text).
    pub const LATIN_EXT_PAIR: usize = 54;
    /// Runs of Greek.
    pub const GREEK_RUNS: usize = 55;
    /// Runs of Arabic.
    pub const ARABIC_RUNS: usize = 56;
    /// Runs of Hebrew.
    pub const HEBREW_RUNS: usize = 57;
    /// Runs of Indic scripts.
    pub const INDIC_RUNS: usize = 58;
    /// Other characters from U+0800 on (letters of scripts without a feature of their own, which
    /// o200k mostly encodes as bytes; supplementary-plane characters other than emoji and Han).
    pub const OTHER_WIDE: usize = 59;
    /// Cyrillic letters that only Ukrainian (and Belarusian) use: і ї є ґ.
    pub const CYRILLIC_UK: usize = 60;
    /// All Cyrillic letters of a text with at least one of [`CYRILLIC_UK`] per 40 (Ukrainian, which
    /// o200k splits into about 1.4 times as many tokens as Russian). Derived: see `derive`.
    pub const CYRILLIC_UK_TEXT: usize = 61;
    /// Latin Extended-A letters (Polish, Czech, Hungarian, Turkish, … but not Vietnamese `đ`).
    pub const LATIN_EXT_A: usize = 62;
    /// ASCII words of five letters or more that the word table does not know, in a text with at
    /// least one accented Latin letter (of words it does not know) per 20 words: French, German,
    /// Spanish, Polish, … whose unknown words split into more tokens than English ones. Derived:
    /// see `derive`.
    pub const LATIN_EXT_A_TEXT: usize = 63;
    /// Runs of tabs in a run of spaces and tabs that does not start a line (tab-separated tables,
    /// alignment): o200k sets the last tab of a run apart (a piece of its own, or with the word after
    /// it, see [`TAB_WORD`]); the tabs before it are the run's piece ([`SPACE_RUNS`]).
    pub const TAB: usize = 64;
    /// Tabs in a run of spaces and tabs right after a line break (indentation), which o200k merges.
    pub const TAB_INDENT: usize = 65;
    /// Half-width katakana (U+FF65..=U+FF9F), which o200k mostly encodes as bytes.
    pub const HALFWIDTH_KANA: usize = 66;
    /// One per text (an intercept: each text is pre-tokenized on its own, and short texts are
    /// rounded up).
    pub const TEXT: usize = 67;
    /// Latin words (plain ASCII of at least five letters, or with accented letters) after a space
    /// that the word table knows as one o200k token with that space (see `words.rs`): counted
    /// here instead of by their length, accented letters and capitals.
    pub const LATIN_KNOWN: usize = 68;
    /// Latin words not after a space that the word table knows as one token without a space
    /// (at the start of a line or text, after punctuation, camelCase humps).
    pub const LATIN_KNOWN_BARE: usize = 69;
    /// Words of the alphabetic scripts (Cyrillic, Greek, Hebrew, Arabic, Indic) after a space that
    /// the word table knows as one token: counted here instead of by their letters and run.
    pub const ALPHA_KNOWN: usize = 70;
    /// Words of the alphabetic scripts not after a space that the word table knows as one token.
    pub const ALPHA_KNOWN_BARE: usize = 71;
    /// Runs of line breaks right after punctuation or a symbol, which o200k takes into the
    /// punctuation's piece (`.\n`, `});\n`, `。\n\n` are one token each): counted here instead of
    /// as [`NEWLINE_RUNS`].
    pub const PUNCT_NEWLINE: usize = 72;
    /// Tabs right before a letter, which o200k takes into the word's piece (`\tfmt`, tab-separated
    /// words): counted on top of the tab features (the fit gives it a weight below 0).
    pub const TAB_WORD: usize = 73;
    /// Characters of [`PUNCT_MIX`] that the next character of the run repeats: the starts of
    /// repeated stretches (`|---|---|`), which o200k keeps as one token each where a mixed run
    /// (`!?.,;:`) merges about two characters to a token.
    pub const PUNCT_REPEAT: usize = 74;
    /// o200k tokens of Thai runs by greedy longest match over the Thai words of the word table and
    /// the Thai pairs that are tokens (see `thai_tokens` in `scripts.rs`).
    pub const THAI_TOKENS: usize = 75;
    /// Runs of katakana (two characters or more) that the word table knows as one o200k token
    /// (loanwords): counted here instead of as [`KATAKANA`] and [`KATAKANA_RUNS`].
    pub const KATA_KNOWN: usize = 76;
    /// Pairs of hiragana, or of katakana, that are an o200k token, taken greedily from the left in
    /// runs of kana: each merges two characters into one token.
    pub const KANA_PAIRS: usize = 77;
    /// Rare letter pairs (see `rare_pairs` in `words.rs`) of plain ASCII words of five letters or
    /// more, at most one of them a capital, that the word table does not know (the all-capital and
    /// `HTTPServer`-like words of code and identifiers have features of their own): random letter strings, which o200k splits into
    /// pieces of about two letters, where word-length rates say one or two tokens a word.
    pub const LATIN_RARE_PAIR: usize = 78;
    /// Letters beyond the 20th of every run of ASCII letters (either case): o200k splits a long run
    /// into pieces of two to eight letters (random letters ≈ 0.52 token a letter, one letter repeated
    /// ≈ 0.125), where the word features, fitted on real words, say one or two tokens a word whatever
    /// its length. Set by hand (0.55): never low on a long run of letters; few real words are longer.
    pub const WORD_EXCESS_LETTERS: usize = 79;
    /// Words of three or four lower-case ASCII letters that are not one o200k token after a space
    /// (see `short_known` in `words.rs`): random short words, which o200k splits (about 1.8 tokens
    /// a word of three random letters, 2.2 of four) where the length features say one; real short
    /// words nearly all are one token. Set by hand.
    pub const LATIN_SHORT_UNKNOWN: usize = 80;
    /// Greek words of six letters or more that the word table does not know but that are two of
    /// its words, the second without a space (a stem and an ending: `εμφαν` + `ίζεται`): o200k
    /// has them in two tokens, where their letters say four or five. Counted here instead of by
    /// their letters and run (see `greek_pieces` in `scripts.rs`). Set by hand (2).
    pub const GREEK_TWO_PIECES: usize = 81;
    /// Greek words of six letters or more that are not one or two words of the table but three
    /// (the second and third without a space): three o200k tokens. Set by hand (3).
    pub const GREEK_THREE_PIECES: usize = 82;
    /// Words of three or four lower-case ASCII letters asked of the short-word table so far (see
    /// [`LATIN_SHORT_UNKNOWN`] and `short_unknown` in `latin.rs`): the first [`SHORT_PROBES`] of a
    /// text are, the rest only once two of them were not tokens. A count that steers the loops, not
    /// weighed (0).
    ///
    /// [`SHORT_PROBES`]: super::SHORT_PROBES
    pub const SHORT_ASKED: usize = 83;
}

/// Weight (tokens) of each feature.
///
/// Written to `fitted.rs` by `examples/fit-estimator.rs` (`cargo run --release --example
/// fit-estimator -- --write`): fitted against OpenAI `o200k_base` (tiktoken-rs) on the even lines of
/// every `corpus/*.jsonl` file only (the odd lines are the held-out split), by weighted least squares
/// on the relative error per sample, every class weighing the same (synthetic junk less), aiming 4 %
/// over o200k with estimates below their real count weighing more (the limiter must not be biased
/// low), a small ridge pull towards fixed priors, and lower bounds (every ASCII word at least one
/// token, no script letter below 0). The features only junk has much of are set by hand in the
/// program (mixed punctuation, newline and space runs of 16/128, symbols, zero-width characters,
/// other scripts, long alphabetic runs, accented-letter pairs, emoji); digit groups follow o200k's
/// rule (1 each). See `docs/estimator.md` for the method and the accuracy on both splits.
pub const WEIGHTS: [f64; NUM_FEATURES] = fixed_length(super::fitted::FITTED);

/// The fitted weights as an array of [`NUM_FEATURES`]: evaluated when compiling, so a `fitted.rs` of
/// another length fails the build (it is written by a program that knows the features only by name).
#[allow(clippy::indexing_slicing)] // const evaluation: out of bounds is a compile error, never a panic
const fn fixed_length(fitted: &[f64]) -> [f64; NUM_FEATURES] {
    assert!(
        fitted.len() == NUM_FEATURES,
        "fitted.rs has a weight per feature"
    );
    let mut out = [0.0; NUM_FEATURES];
    let mut i = 0;
    while i < NUM_FEATURES {
        out[i] = fitted[i];
        i += 1;
    }
    out
}

/// Names of the features, in feature order (for the fitting program's output).
#[doc(hidden)]
pub const FEATURE_NAMES: [&str; NUM_FEATURES] = [
    "word_1",
    "word_2",
    "word_3",
    "word_4",
    "word_5",
    "word_6",
    "word_7",
    "word_8",
    "word_9_10",
    "word_long",
    "word_long_chars",
    "latin_ext",
    "cyrillic",
    "greek",
    "arabic",
    "indic",
    "alpha_runs",
    "thai",
    "thai_runs",
    "hiragana",
    "katakana",
    "han",
    "cjk_runs",
    "hangul",
    "hangul_runs",
    "digit_groups",
    "punct",
    "punct_runs",
    "wide_punct",
    "emoji",
    "other",
    "newline_runs",
    "space_runs",
    "space_before_digit",
    "upper",
    "punct_word",
    "han_rare",
    "han_merge",
    "hangul_rare",
    "hangul_merge",
    "thai_common",
    "thai_rare",
    "caps_word_chars",
    "katakana_runs",
    "hump",
    "alnum_switch",
    "punct_mix",
    "newline_16",
    "space_128",
    "symbol",
    "zero_width",
    "zero_width_runs",
    "hebrew",
    "alpha_long",
    "latin_ext_pair",
    "greek_runs",
    "arabic_runs",
    "hebrew_runs",
    "indic_runs",
    "other_wide",
    "cyrillic_uk",
    "cyrillic_uk_text",
    "latin_ext_a",
    "latin_ext_a_text",
    "tab",
    "tab_indent",
    "halfwidth_kana",
    "text",
    "latin_known",
    "latin_known_bare",
    "alpha_known",
    "alpha_known_bare",
    "punct_newline",
    "tab_word",
    "punct_repeat",
    "thai_tokens",
    "kata_known",
    "kana_pairs",
    "latin_rare_pair",
    "word_excess_letters",
    "latin_short_unknown",
    "greek_two_pieces",
    "greek_three_pieces",
    "short_asked",
];
