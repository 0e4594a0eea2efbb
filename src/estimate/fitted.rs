//! The estimator's weights, written by `cargo run --release --example fit-estimator -- --write`
//! (see `examples/fit-estimator.rs`): do not edit by hand, refit.

use super::weights::NUM_FEATURES;

/// Weight (tokens) of each feature, in feature order (see `weights.rs`).
#[rustfmt::skip]
#[allow(clippy::approx_constant)] // fitted numbers that may look like 1/π
pub(super) const FITTED: [f64; NUM_FEATURES] = [
    1.000, // word_1, set by hand
    1.000, // word_2, set by hand
    1.206, // word_3
    1.000, // word_4, set by hand
    1.576, // word_5
    1.021, // word_6
    1.286, // word_7
    1.436, // word_8
    1.473, // word_9_10
    1.529, // word_long
    -0.003, // word_long_chars
    0.522, // latin_ext
    0.225, // cyrillic
    0.349, // greek
    0.307, // arabic
    0.333, // indic
    0.743, // alpha_runs
    0.136, // thai
    -0.236, // thai_runs
    0.880, // hiragana
    1.196, // katakana
    1.688, // han
    0.046, // cjk_runs
    1.193, // hangul
    0.291, // hangul_runs
    1.000, // digit_groups, set by hand
    0.000, // punct, set by hand
    1.000, // punct_runs, set by hand
    0.094, // wide_punct
    1.600, // emoji, set by hand
    0.991, // other
    1.000, // newline_runs, set by hand
    1.000, // space_runs, set by hand
    1.000, // space_before_digit, set by hand
    0.333, // upper
    -0.691, // punct_word
    2.598, // han_rare
    0.794, // han_merge
    2.330, // hangul_rare
    0.641, // hangul_merge
    0.030, // thai_common
    0.000, // thai_rare, set by hand
    -0.291, // caps_word_chars
    0.693, // katakana_runs
    0.065, // hump
    0.400, // alnum_switch
    0.600, // punct_mix, set by hand
    1.000, // newline_16, set by hand
    1.000, // space_128, set by hand
    1.500, // symbol, set by hand
    0.250, // zero_width, set by hand
    1.000, // zero_width_runs, set by hand
    0.299, // hebrew
    0.550, // alpha_long, set by hand
    0.950, // latin_ext_pair, set by hand
    0.864, // greek_runs
    0.871, // arabic_runs
    0.959, // hebrew_runs
    0.994, // indic_runs
    3.000, // other_wide, set by hand
    0.409, // cyrillic_uk
    0.052, // cyrillic_uk_text
    0.995, // latin_ext_a
    0.446, // latin_ext_a_text
    1.258, // tab
    0.000, // tab_indent, set by hand
    2.000, // halfwidth_kana, set by hand
    0.103, // text
    1.000, // latin_known, set by hand
    1.000, // latin_known_bare, set by hand
    1.000, // alpha_known, set by hand
    1.000, // alpha_known_bare, set by hand
    0.000, // punct_newline, set by hand
    -0.253, // tab_word
    0.369, // punct_repeat
    0.901, // thai_tokens
    1.074, // kata_known
    -1.010, // kana_pairs
    0.000, // reserved_78
    0.000, // reserved_79
];
