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
    1.548, // word_8
    1.647, // word_9_10
    1.356, // word_long
    0.042, // word_long_chars
    0.000, // latin_ext, set by hand
    0.173, // cyrillic
    0.360, // greek
    0.201, // arabic
    0.316, // indic
    0.555, // alpha_runs
    0.600, // thai
    -0.561, // thai_runs
    0.730, // hiragana
    0.636, // katakana
    1.359, // han
    0.201, // cjk_runs
    1.217, // hangul
    0.250, // hangul_runs
    1.000, // digit_groups, set by hand
    0.000, // punct, set by hand
    1.085, // punct_runs
    1.068, // wide_punct
    1.600, // emoji, set by hand
    0.910, // other
    0.667, // newline_runs
    0.081, // space_runs
    0.568, // space_before_digit
    -0.084, // upper
    -0.574, // punct_word
    2.431, // han_rare
    0.702, // han_merge
    2.388, // hangul_rare
    0.648, // hangul_merge
    0.419, // thai_common
    0.423, // thai_rare
    0.142, // caps_word_chars
    0.518, // katakana_runs
    0.380, // hump
    0.553, // alnum_switch
    0.600, // punct_mix, set by hand
    1.000, // newline_16, set by hand
    1.000, // space_128, set by hand
    1.500, // symbol, set by hand
    0.250, // zero_width, set by hand
    1.000, // zero_width_runs, set by hand
    0.227, // hebrew
    0.550, // alpha_long, set by hand
    0.950, // latin_ext_pair, set by hand
    0.399, // greek_runs
    0.626, // arabic_runs
    0.907, // hebrew_runs
    0.315, // indic_runs
    3.000, // other_wide, set by hand
    0.405, // cyrillic_uk
    0.093, // cyrillic_uk_text
    1.283, // latin_ext_a
    0.070, // latin_ext_a_text
    1.091, // tab
    0.796, // tab_indent
    1.755, // halfwidth_kana
    0.132, // text
];
