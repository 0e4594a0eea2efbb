//! The estimator's weights, written by `cargo run --release --example fit-estimator -- --write`
//! (see `examples/fit-estimator.rs`): do not edit by hand, refit.

use super::weights::NUM_FEATURES;

/// Weight (tokens) of each feature, in feature order (see `weights.rs`).
#[rustfmt::skip]
#[allow(clippy::approx_constant)] // fitted numbers that may look like 1/π
pub(super) const FITTED: [f64; NUM_FEATURES] = [
    1.000, // word_1, set by hand
    1.000, // word_2, set by hand
    1.205, // word_3
    1.000, // word_4, set by hand
    1.553, // word_5
    1.000, // word_6, set by hand
    1.298, // word_7
    1.468, // word_8
    1.460, // word_9_10
    1.540, // word_long
    -0.002, // word_long_chars
    0.538, // latin_ext
    0.225, // cyrillic
    0.349, // greek
    0.310, // arabic
    0.340, // indic
    0.747, // alpha_runs
    0.685, // thai
    -0.514, // thai_runs
    0.597, // hiragana
    0.971, // katakana
    1.784, // han
    -0.173, // cjk_runs
    1.192, // hangul
    0.292, // hangul_runs
    1.000, // digit_groups, set by hand
    0.000, // punct, set by hand
    1.000, // punct_runs, set by hand
    0.000, // wide_punct, set by hand
    1.600, // emoji, set by hand
    0.991, // other
    1.000, // newline_runs, set by hand
    1.000, // space_runs, set by hand
    1.000, // space_before_digit, set by hand
    0.338, // upper
    -0.678, // punct_word
    2.716, // han_rare
    0.822, // han_merge
    2.327, // hangul_rare
    0.642, // hangul_merge
    0.371, // thai_common
    0.341, // thai_rare
    -0.303, // caps_word_chars
    0.740, // katakana_runs
    0.064, // hump
    0.401, // alnum_switch
    0.600, // punct_mix, set by hand
    1.000, // newline_16, set by hand
    1.000, // space_128, set by hand
    1.500, // symbol, set by hand
    0.250, // zero_width, set by hand
    1.000, // zero_width_runs, set by hand
    0.301, // hebrew
    0.550, // alpha_long, set by hand
    0.950, // latin_ext_pair, set by hand
    0.861, // greek_runs
    0.835, // arabic_runs
    0.955, // hebrew_runs
    0.979, // indic_runs
    3.000, // other_wide, set by hand
    0.413, // cyrillic_uk
    0.052, // cyrillic_uk_text
    0.986, // latin_ext_a
    0.443, // latin_ext_a_text
    1.482, // tab
    0.038, // tab_indent
    2.000, // halfwidth_kana, set by hand
    0.077, // text
    1.000, // latin_known, set by hand
    1.000, // latin_known_bare, set by hand
    1.000, // alpha_known, set by hand
    1.000, // alpha_known_bare, set by hand
    0.000, // punct_newline, set by hand
    -0.658, // tab_word
    0.000, // reserved_74
    0.000, // reserved_75
];
