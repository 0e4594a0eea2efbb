//! The estimator's weights, written by `cargo run --release --example fit-estimator -- --write`
//! (see `examples/fit-estimator.rs`): do not edit by hand, refit.

use super::weights::NUM_FEATURES;

/// Weight (tokens) of each feature, in feature order (see `weights.rs`).
#[rustfmt::skip]
#[allow(clippy::approx_constant)] // fitted numbers that may look like 1/π
pub(super) const FITTED: [f64; NUM_FEATURES] = [
    1.000, // word_1, set by hand
    1.000, // word_2, set by hand
    1.202, // word_3
    1.000, // word_4, set by hand
    1.533, // word_5
    1.003, // word_6
    1.292, // word_7
    1.452, // word_8
    1.463, // word_9_10
    1.545, // word_long
    -0.001, // word_long_chars
    0.539, // latin_ext
    0.225, // cyrillic
    0.349, // greek
    0.310, // arabic
    0.339, // indic
    0.749, // alpha_runs
    0.674, // thai
    -0.416, // thai_runs
    0.595, // hiragana
    0.970, // katakana
    1.787, // han
    -0.158, // cjk_runs
    1.191, // hangul
    0.290, // hangul_runs
    1.000, // digit_groups, set by hand
    0.000, // punct, set by hand
    1.000, // punct_runs, set by hand
    0.000, // wide_punct, set by hand
    1.600, // emoji, set by hand
    0.991, // other
    1.000, // newline_runs, set by hand
    1.000, // space_runs, set by hand
    1.000, // space_before_digit, set by hand
    0.342, // upper
    -0.674, // punct_word
    2.721, // han_rare
    0.820, // han_merge
    2.326, // hangul_rare
    0.643, // hangul_merge
    0.371, // thai_common
    0.340, // thai_rare
    -0.310, // caps_word_chars
    0.743, // katakana_runs
    0.054, // hump
    0.404, // alnum_switch
    0.600, // punct_mix, set by hand
    1.000, // newline_16, set by hand
    1.000, // space_128, set by hand
    1.500, // symbol, set by hand
    0.250, // zero_width, set by hand
    1.000, // zero_width_runs, set by hand
    0.301, // hebrew
    0.550, // alpha_long, set by hand
    0.950, // latin_ext_pair, set by hand
    0.862, // greek_runs
    0.836, // arabic_runs
    0.956, // hebrew_runs
    0.985, // indic_runs
    3.000, // other_wide, set by hand
    0.410, // cyrillic_uk
    0.053, // cyrillic_uk_text
    0.994, // latin_ext_a
    0.439, // latin_ext_a_text
    1.336, // tab
    0.000, // tab_indent, set by hand
    2.000, // halfwidth_kana, set by hand
    0.075, // text
    1.000, // latin_known, set by hand
    1.000, // latin_known_bare, set by hand
    1.000, // alpha_known, set by hand
    1.000, // alpha_known_bare, set by hand
    0.000, // punct_newline, set by hand
    -0.225, // tab_word
    0.369, // punct_repeat
    0.000, // reserved_75
];
