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
    1.555, // word_5
    1.012, // word_6
    1.295, // word_7
    1.456, // word_8
    1.461, // word_9_10
    1.535, // word_long
    -0.002, // word_long_chars
    0.532, // latin_ext
    0.221, // cyrillic
    0.351, // greek
    0.310, // arabic
    0.335, // indic
    0.776, // alpha_runs
    0.685, // thai
    -0.513, // thai_runs
    0.597, // hiragana
    0.970, // katakana
    1.785, // han
    -0.173, // cjk_runs
    1.194, // hangul
    0.293, // hangul_runs
    1.000, // digit_groups, set by hand
    0.000, // punct, set by hand
    1.000, // punct_runs, set by hand
    0.000, // wide_punct, set by hand
    1.600, // emoji, set by hand
    0.992, // other
    1.000, // newline_runs, set by hand
    1.000, // space_runs, set by hand
    1.000, // space_before_digit, set by hand
    0.342, // upper
    -0.681, // punct_word
    2.712, // han_rare
    0.822, // han_merge
    2.327, // hangul_rare
    0.641, // hangul_merge
    0.371, // thai_common
    0.340, // thai_rare
    -0.306, // caps_word_chars
    0.741, // katakana_runs
    0.066, // hump
    0.398, // alnum_switch
    0.600, // punct_mix, set by hand
    1.000, // newline_16, set by hand
    1.000, // space_128, set by hand
    1.500, // symbol, set by hand
    0.250, // zero_width, set by hand
    1.000, // zero_width_runs, set by hand
    0.300, // hebrew
    0.550, // alpha_long, set by hand
    0.950, // latin_ext_pair, set by hand
    0.853, // greek_runs
    0.840, // arabic_runs
    0.959, // hebrew_runs
    0.979, // indic_runs
    3.000, // other_wide, set by hand
    0.414, // cyrillic_uk
    0.051, // cyrillic_uk_text
    0.987, // latin_ext_a
    0.443, // latin_ext_a_text
    1.485, // tab
    0.043, // tab_indent
    2.000, // halfwidth_kana, set by hand
    0.078, // text
    1.000, // latin_known, set by hand
    1.000, // latin_known_bare, set by hand
    1.000, // alpha_known, set by hand
    1.000, // alpha_known_bare, set by hand
    0.000, // punct_newline, set by hand
    -0.655, // tab_word
    0.000, // reserved_74
    0.000, // reserved_75
];
