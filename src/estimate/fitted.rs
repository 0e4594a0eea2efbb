//! The estimator's weights, written by `cargo run --release --example fit-estimator -- --write`
//! (see `examples/fit-estimator.rs`): do not edit by hand, refit.

use super::weights::NUM_FEATURES;

/// Weight (tokens) of each feature, in feature order (see `weights.rs`).
#[rustfmt::skip]
#[allow(clippy::approx_constant)] // fitted numbers that may look like 1/π
pub(super) const FITTED: [f64; NUM_FEATURES] = [
    1.000, // word_1, set by hand
    1.000, // word_2, set by hand
    1.218, // word_3
    1.000, // word_4, set by hand
    1.511, // word_5
    1.076, // word_6
    1.272, // word_7
    1.453, // word_8
    1.498, // word_9_10
    1.533, // word_long
    -0.010, // word_long_chars
    0.530, // latin_ext
    0.226, // cyrillic
    0.345, // greek
    0.309, // arabic
    0.333, // indic
    0.735, // alpha_runs
    0.140, // thai
    -0.229, // thai_runs
    0.882, // hiragana
    1.194, // katakana
    1.684, // han
    0.057, // cjk_runs
    1.195, // hangul
    0.294, // hangul_runs
    1.000, // digit_groups, set by hand
    0.000, // punct, set by hand
    1.000, // punct_runs, set by hand
    0.086, // wide_punct
    1.600, // emoji, set by hand
    1.004, // other
    1.000, // newline_runs, set by hand
    1.000, // space_runs, set by hand
    1.000, // space_before_digit, set by hand
    0.325, // upper
    -0.743, // punct_word
    2.569, // han_rare
    0.793, // han_merge
    2.341, // hangul_rare
    0.638, // hangul_merge
    0.029, // thai_common
    0.000, // thai_rare, set by hand
    -0.272, // caps_word_chars
    0.698, // katakana_runs
    0.071, // hump
    0.310, // alnum_switch
    0.670, // punct_mix, set by hand
    1.000, // newline_16, set by hand
    1.000, // space_128, set by hand
    1.500, // symbol, set by hand
    0.250, // zero_width, set by hand
    1.000, // zero_width_runs, set by hand
    0.298, // hebrew
    0.550, // alpha_long, set by hand
    0.950, // latin_ext_pair, set by hand
    0.880, // greek_runs
    0.854, // arabic_runs
    0.959, // hebrew_runs
    0.989, // indic_runs
    3.000, // other_wide, set by hand
    0.423, // cyrillic_uk
    0.051, // cyrillic_uk_text
    0.958, // latin_ext_a
    0.387, // latin_ext_a_text
    1.253, // tab
    0.033, // tab_indent
    2.000, // halfwidth_kana, set by hand
    0.111, // text
    1.000, // latin_known, set by hand
    1.000, // latin_known_bare, set by hand
    1.000, // alpha_known, set by hand
    1.000, // alpha_known_bare, set by hand
    0.000, // punct_newline, set by hand
    -0.218, // tab_word
    0.200, // punct_repeat
    0.897, // thai_tokens
    1.067, // kata_known
    -1.019, // kana_pairs
    1.400, // latin_rare_pair, set by hand
    0.550, // word_excess_letters, set by hand
    1.000, // latin_rare_pair_short, set by hand
    0.000, // reserved_81, set by hand
    0.000, // reserved_82, set by hand
    0.000, // reserved_83, set by hand
];
