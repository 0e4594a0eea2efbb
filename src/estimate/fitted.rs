//! The estimator's weights, written by `cargo run --release --example fit-estimator -- --write`
//! (see `examples/fit-estimator.rs`): do not edit by hand, refit.

/// Weight (tokens) of each feature, in feature order (see `weights.rs`).
#[rustfmt::skip]
#[allow(clippy::approx_constant)] // fitted numbers that may look like 1/π
pub(super) const FITTED: &[f64] = &[
    1.000, // word_1, set by hand
    1.000, // word_2, set by hand
    1.232, // word_3
    1.000, // word_4, set by hand
    1.482, // word_5
    1.117, // word_6
    1.312, // word_7
    1.406, // word_8
    1.530, // word_9_10
    1.550, // word_long
    -0.006, // word_long_chars
    0.547, // latin_ext
    0.232, // cyrillic
    0.418, // greek
    0.314, // arabic
    0.333, // indic
    0.695, // alpha_runs
    0.121, // thai
    -0.219, // thai_runs
    0.926, // hiragana
    1.058, // katakana
    1.718, // han
    0.062, // cjk_runs
    1.192, // hangul
    0.286, // hangul_runs
    1.000, // digit_groups, set by hand
    0.000, // punct, set by hand
    1.000, // punct_runs, set by hand
    0.066, // wide_punct
    1.600, // emoji, set by hand
    0.999, // other
    1.000, // newline_runs, set by hand
    1.000, // space_runs, set by hand
    1.000, // space_before_digit, set by hand
    0.283, // upper
    -0.727, // punct_word
    2.518, // han_rare
    0.795, // han_merge
    2.347, // hangul_rare
    0.641, // hangul_merge
    0.032, // thai_common
    0.000, // thai_rare, set by hand
    -0.252, // caps_word_chars
    0.822, // katakana_runs
    0.023, // hump
    0.172, // alnum_switch
    0.670, // punct_mix, set by hand
    1.000, // newline_16, set by hand
    1.000, // space_128, set by hand
    1.500, // symbol, set by hand
    0.250, // zero_width, set by hand
    1.000, // zero_width_runs, set by hand
    0.293, // hebrew
    0.550, // alpha_long, set by hand
    0.950, // latin_ext_pair, set by hand
    0.843, // greek_runs
    0.804, // arabic_runs
    0.993, // hebrew_runs
    0.982, // indic_runs
    3.000, // other_wide, set by hand
    0.426, // cyrillic_uk
    0.052, // cyrillic_uk_text
    0.887, // latin_ext_a
    0.363, // latin_ext_a_text
    1.243, // tab
    0.044, // tab_indent
    2.000, // halfwidth_kana, set by hand
    0.098, // text
    1.000, // latin_known, set by hand
    1.000, // latin_known_bare, set by hand
    1.000, // alpha_known, set by hand
    1.000, // alpha_known_bare, set by hand
    0.000, // punct_newline, set by hand
    -0.193, // tab_word
    0.151, // punct_repeat
    0.904, // thai_tokens
    1.123, // kata_known
    -1.078, // kana_pairs
    1.400, // latin_rare_pair, set by hand
    0.550, // word_excess_letters, set by hand
    1.350, // latin_short_unknown, set by hand
    2.000, // greek_two_pieces, set by hand
    3.000, // greek_three_pieces, set by hand
    0.000, // short_asked, set by hand
];
