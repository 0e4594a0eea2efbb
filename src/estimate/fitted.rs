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
    1.309, // word_5
    1.000, // word_6, set by hand
    1.784, // word_7
    1.728, // word_8
    1.644, // word_9_10
    1.315, // word_long
    0.011, // word_long_chars
    0.000, // latin_ext, set by hand
    0.184, // cyrillic
    0.363, // greek
    0.289, // arabic
    0.363, // indic
    0.993, // alpha_runs
    0.596, // thai
    -0.635, // thai_runs
    0.745, // hiragana
    0.621, // katakana
    1.333, // han
    0.089, // cjk_runs
    1.141, // hangul
    0.241, // hangul_runs
    1.000, // digit_groups, set by hand
    0.116, // punct
    0.925, // punct_runs
    1.148, // wide_punct
    1.600, // emoji, set by hand
    0.873, // other
    1.242, // newline_runs
    1.583, // space_runs
    0.649, // space_before_digit
    0.407, // upper
    -0.732, // punct_word
    2.623, // han_rare
    0.706, // han_merge
    2.396, // hangul_rare
    0.663, // hangul_merge
    0.426, // thai_common
    0.391, // thai_rare
    -0.437, // caps_word_chars
    0.473, // katakana_runs
    -0.115, // hump
    0.468, // alnum_switch
    0.600, // punct_mix, set by hand
    1.000, // newline_16, set by hand
    1.000, // space_128, set by hand
    1.500, // symbol, set by hand
    0.250, // zero_width, set by hand
    1.000, // zero_width_runs, set by hand
    0.285, // hebrew
    0.550, // alpha_long, set by hand
    0.950, // latin_ext_pair, set by hand
    0.733, // greek_runs
    0.966, // arabic_runs
    1.051, // hebrew_runs
    0.757, // indic_runs
    3.000, // other_wide, set by hand
    0.510, // cyrillic_uk
    0.044, // cyrillic_uk_text
    1.206, // latin_ext_a
    0.164, // latin_ext_a_text
    1.035, // tab
    0.246, // tab_indent
    2.000, // halfwidth_kana, set by hand
    0.244, // text
    1.081, // latin_known
    1.212, // latin_known_bare
    1.016, // alpha_known
    0.825, // alpha_known_bare
    -0.540, // punct_newline
    -0.512, // tab_word
    0.000, // reserved_74
    0.000, // reserved_75
];
