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
    1.496, // word_5
    1.078, // word_6
    1.287, // word_7
    1.465, // word_8
    1.512, // word_9_10
    1.552, // word_long
    -0.014, // word_long_chars
    0.533, // latin_ext
    0.225, // cyrillic
    0.417, // greek
    0.312, // arabic
    0.333, // indic
    0.740, // alpha_runs
    0.142, // thai
    -0.234, // thai_runs
    0.885, // hiragana
    1.191, // katakana
    1.679, // han
    0.064, // cjk_runs
    1.195, // hangul
    0.294, // hangul_runs
    1.000, // digit_groups, set by hand
    0.000, // punct, set by hand
    1.000, // punct_runs, set by hand
    0.099, // wide_punct
    1.600, // emoji, set by hand
    0.987, // other
    1.000, // newline_runs, set by hand
    1.000, // space_runs, set by hand
    1.000, // space_before_digit, set by hand
    0.340, // upper
    -0.743, // punct_word
    2.562, // han_rare
    0.791, // han_merge
    2.341, // hangul_rare
    0.638, // hangul_merge
    0.030, // thai_common
    0.000, // thai_rare, set by hand
    -0.292, // caps_word_chars
    0.696, // katakana_runs
    0.038, // hump
    0.302, // alnum_switch
    0.670, // punct_mix, set by hand
    1.000, // newline_16, set by hand
    1.000, // space_128, set by hand
    1.500, // symbol, set by hand
    0.250, // zero_width, set by hand
    1.000, // zero_width_runs, set by hand
    0.292, // hebrew
    0.550, // alpha_long, set by hand
    0.950, // latin_ext_pair, set by hand
    0.847, // greek_runs
    0.815, // arabic_runs
    0.999, // hebrew_runs
    0.982, // indic_runs
    3.000, // other_wide, set by hand
    0.423, // cyrillic_uk
    0.051, // cyrillic_uk_text
    0.933, // latin_ext_a
    0.386, // latin_ext_a_text
    1.266, // tab
    0.036, // tab_indent
    2.000, // halfwidth_kana, set by hand
    0.103, // text
    1.000, // latin_known, set by hand
    1.000, // latin_known_bare, set by hand
    1.000, // alpha_known, set by hand
    1.000, // alpha_known_bare, set by hand
    0.000, // punct_newline, set by hand
    -0.212, // tab_word
    0.147, // punct_repeat
    0.895, // thai_tokens
    1.091, // kata_known
    -1.022, // kana_pairs
    1.400, // latin_rare_pair, set by hand
    0.550, // word_excess_letters, set by hand
    1.000, // latin_rare_pair_short, set by hand
    2.000, // greek_two_pieces, set by hand
    3.000, // greek_three_pieces, set by hand
    0.000, // reserved_83, set by hand
];
