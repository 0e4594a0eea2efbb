//! The estimator's weights, written by `cargo run --release --example fit-estimator -- --write`
//! (see `examples/fit-estimator.rs`): do not edit by hand, refit.

use super::weights::NUM_FEATURES;

/// Weight (tokens) of each feature, in feature order (see `weights.rs`).
#[rustfmt::skip]
#[allow(clippy::approx_constant)] // fitted numbers that may look like 1/π
pub(super) const FITTED: [f64; NUM_FEATURES] = [
    1.000, // word_1, set by hand
    1.000, // word_2, set by hand
    1.000, // word_3, set by hand
    1.000, // word_4, set by hand
    1.000, // word_5, set by hand
    1.000, // word_6, set by hand
    1.000, // word_7, set by hand
    1.547, // word_8
    1.688, // word_9_10
    1.351, // word_long
    0.043, // word_long_chars
    0.000, // latin_ext, set by hand
    0.164, // cyrillic
    0.359, // greek
    0.194, // arabic
    0.307, // indic
    0.606, // alpha_runs
    0.597, // thai
    -0.556, // thai_runs
    0.730, // hiragana
    0.641, // katakana
    1.342, // han
    0.156, // cjk_runs
    1.213, // hangul
    0.244, // hangul_runs
    1.000, // digit_groups, set by hand
    0.000, // punct, set by hand
    1.044, // punct_runs
    1.101, // wide_punct
    1.600, // emoji, set by hand
    0.917, // other
    1.043, // newline_runs
    -0.208, // space_runs
    0.570, // space_before_digit
    -0.089, // upper
    -0.541, // punct_word
    2.434, // han_rare
    0.703, // han_merge
    2.393, // hangul_rare
    0.650, // hangul_merge
    0.418, // thai_common
    0.430, // thai_rare
    0.144, // caps_word_chars
    0.517, // katakana_runs
    0.378, // hump
    0.565, // alnum_switch
    0.600, // punct_mix, set by hand
    1.000, // newline_16, set by hand
    1.000, // space_128, set by hand
    1.500, // symbol, set by hand
    0.250, // zero_width, set by hand
    1.000, // zero_width_runs, set by hand
    0.229, // hebrew
    0.550, // alpha_long, set by hand
    0.950, // latin_ext_pair, set by hand
    0.397, // greek_runs
    0.657, // arabic_runs
    0.895, // hebrew_runs
    0.344, // indic_runs
    3.000, // other_wide, set by hand
    0.388, // cyrillic_uk
    0.093, // cyrillic_uk_text
    1.284, // latin_ext_a
    0.070, // latin_ext_a_text
    0.998, // tab
    0.237, // tab_indent
    2.000, // halfwidth_kana, set by hand
    0.140, // text
];
