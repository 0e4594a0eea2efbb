//! The estimator's weights, written by `cargo run --release --example fit-estimator -- --write`
//! (see `examples/fit-estimator.rs`): do not edit by hand, refit.

use super::weights::NUM_FEATURES;

/// Weight (tokens) of each feature, in feature order (see `weights.rs`).
#[rustfmt::skip]
#[allow(clippy::approx_constant)] // fitted numbers that may look like 1/π
pub(super) const FITTED: [f64; NUM_FEATURES] = [
    1.000, // word_1, set by hand
    1.000, // word_2, set by hand
    1.167, // word_3
    1.000, // word_4, set by hand
    1.682, // word_5
    1.093, // word_6
    1.343, // word_7
    1.602, // word_8
    1.529, // word_9_10
    1.355, // word_long
    0.016, // word_long_chars
    0.187, // latin_ext
    0.232, // cyrillic
    0.364, // greek
    0.295, // arabic
    0.333, // indic
    0.707, // alpha_runs
    0.691, // thai
    -0.508, // thai_runs
    0.597, // hiragana
    0.965, // katakana
    1.769, // han
    -0.179, // cjk_runs
    1.195, // hangul
    0.295, // hangul_runs
    1.000, // digit_groups, set by hand
    0.000, // punct, set by hand
    1.000, // punct_runs, set by hand
    0.000, // wide_punct, set by hand
    1.600, // emoji, set by hand
    0.901, // other
    1.000, // newline_runs, set by hand
    1.000, // space_runs, set by hand
    1.000, // space_before_digit, set by hand
    0.258, // upper
    -0.707, // punct_word
    2.686, // han_rare
    0.823, // han_merge
    2.346, // hangul_rare
    0.638, // hangul_merge
    0.367, // thai_common
    0.334, // thai_rare
    -0.194, // caps_word_chars
    0.738, // katakana_runs
    0.188, // hump
    0.401, // alnum_switch
    0.600, // punct_mix, set by hand
    1.000, // newline_16, set by hand
    1.000, // space_128, set by hand
    1.500, // symbol, set by hand
    0.250, // zero_width, set by hand
    1.000, // zero_width_runs, set by hand
    0.304, // hebrew
    0.550, // alpha_long, set by hand
    0.950, // latin_ext_pair, set by hand
    0.776, // greek_runs
    0.935, // arabic_runs
    0.953, // hebrew_runs
    0.991, // indic_runs
    3.000, // other_wide, set by hand
    0.271, // cyrillic_uk
    0.069, // cyrillic_uk_text
    1.077, // latin_ext_a
    0.224, // latin_ext_a_text
    1.086, // tab
    0.113, // tab_indent
    2.000, // halfwidth_kana, set by hand
    0.081, // text
    1.000, // latin_known, set by hand
    1.000, // latin_known_bare, set by hand
    1.000, // alpha_known, set by hand
    1.000, // alpha_known_bare, set by hand
    0.000, // punct_newline, set by hand
    -0.537, // tab_word
    0.000, // reserved_74
    0.000, // reserved_75
];
