//! Cost weights: how many quota units one token of each kind costs, per model (`quota.weights`), and the
//! conversions between weighted costs and output tokens used when a reservation is clamped. The same
//! [`weighted`] prices the reservation (estimated prompt, max output) and the settlement (actual usage),
//! so their difference is exact.
//!
//! ```
//! # use tokengate::quota::{weighted, Weights};
//! let w = Weights { input: 1.0, output: 4.0, cached_input: 0.25, reasoning: 4.0 };
//! // 600 uncached + 400 cached prompt tokens, 100 output tokens (50 of them reasoning)
//! assert_eq!(weighted(1000, 100, 400, 50, &w), 600 + 100 + 400);
//! ```

use crate::shim::webdis::MAX_LUA_INT;

/// Per-model price weights: how many quota units one token of each kind costs.
///
/// `cached` is the part of the prompt served from the provider's cache and `reasoning` the part of the
/// output spent on reasoning (both already counted inside prompt/output, as OpenAI reports them).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Weights {
    /// Weight of an uncached prompt token.
    pub input: f64,
    /// Weight of a visible output token.
    pub output: f64,
    /// Weight of a cached prompt token.
    pub cached_input: f64,
    /// Weight of a reasoning output token.
    pub reasoning: f64,
}

impl Weights {
    /// Every token counts 1: the quota is in plain tokens.
    pub const UNIT: Weights = Weights {
        input: 1.0,
        output: 1.0,
        cached_input: 1.0,
        reasoning: 1.0,
    };

    /// Checks every weight is finite and ≥ 0 (for config validation); names the bad field.
    pub fn validate(&self) -> Result<(), &'static str> {
        for (name, w) in [
            ("input", self.input),
            ("output", self.output),
            ("cached_input", self.cached_input),
            ("reasoning", self.reasoning),
        ] {
            if !w.is_finite() || w < 0.0 {
                return Err(name);
            }
        }
        Ok(())
    }
}

impl Default for Weights {
    fn default() -> Self {
        Self::UNIT
    }
}

fn w(x: f64) -> f64 {
    if x.is_finite() && x > 0.0 {
        x
    } else {
        0.0
    }
}

/// Weighted cost, rounded up, capped at [`MAX_LUA_INT`]. The same function prices the reservation
/// (estimated prompt, max output, 0, 0) and the settlement (actual usage), so their difference is exact.
/// `cached` is capped at `prompt` and `reasoning` at `output`; invalid weights count as 0.
pub fn weighted(prompt: u64, output: u64, cached: u64, reasoning: u64, weights: &Weights) -> u64 {
    let cached = cached.min(prompt);
    let reasoning = reasoning.min(output);
    let units = (prompt - cached) as f64 * w(weights.input)
        + cached as f64 * w(weights.cached_input)
        + (output - reasoning) as f64 * w(weights.output)
        + reasoning as f64 * w(weights.reasoning);
    // Subtract a hair so that 1.1 * 10 (= 11.000000000000002) does not round up to 12.
    let c = (units - 1e-9).ceil();
    if c >= MAX_LUA_INT as f64 {
        MAX_LUA_INT
    } else if c > 0.0 {
        c as u64
    } else {
        0
    }
}

/// How many output tokens a granted output cost buys (floor), for one choice (see
/// [`clamped_output_tokens`] for `n` > 1). A zero output weight makes output free: `u64::MAX`.
pub fn output_tokens_for_cost(cost: u64, weights: &Weights) -> u64 {
    let ow = w(weights.output);
    if ow == 0.0 {
        return u64::MAX;
    }
    let t = (cost as f64 / ow + 1e-9).floor();
    if t >= MAX_LUA_INT as f64 {
        MAX_LUA_INT
    } else if t > 0.0 {
        t as u64
    } else {
        0
    }
}

/// The output limit per choice to write into the body after a [`Reason::Clamped`] reservation that
/// granted `granted_cost` for `choices` choices (the estimate's `output_choices`, e.g. `n`): the
/// provider bills every choice, so prompt + `choices` × tokens × output weight stays within what was
/// left. A zero output weight makes output free: `u64::MAX`.
///
/// [`Reason::Clamped`]: super::Reason::Clamped
pub fn clamped_output_tokens(granted_cost: u64, weights: &Weights, choices: u64) -> u64 {
    let all_choices = Weights {
        output: w(weights.output) * choices.max(1) as f64,
        ..*weights
    };
    output_tokens_for_cost(granted_cost, &all_choices)
}

/// The smallest output cost worth admitting when clamping `choices` choices: one token each.
pub fn min_clamped_output_cost(weights: &Weights, choices: u64) -> u64 {
    weighted(0, choices.max(1), 0, 0, weights).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weighted_cost_rounds_up_and_splits_cached_and_reasoning_tokens() {
        let w = Weights {
            input: 1.0,
            output: 4.0,
            cached_input: 0.25,
            reasoning: 4.0,
        };
        assert_eq!(weighted(1000, 100, 400, 50, &w), 600 + 100 + 400);
        assert_eq!(weighted(1, 0, 1, 0, &w), 1); // 0.25 rounds up
        assert_eq!(
            weighted(
                10,
                0,
                0,
                0,
                &Weights {
                    input: 1.1,
                    ..Weights::UNIT
                }
            ),
            11
        );
        assert_eq!(weighted(0, 0, 0, 0, &w), 0);
        assert_eq!(
            weighted(5, 5, 99, 99, &Weights::UNIT),
            10,
            "cached and reasoning are capped"
        );
    }

    #[test]
    fn weighted_cost_saturates_and_treats_invalid_weights_as_zero() {
        let bad = Weights {
            input: f64::NAN,
            output: -3.0,
            cached_input: f64::INFINITY,
            reasoning: 1.0,
        };
        assert_eq!(weighted(10, 10, 5, 0, &bad), 0);
        assert_eq!(bad.validate(), Err("input"));
        assert_eq!(Weights::UNIT.validate(), Ok(()));
        assert_eq!(
            weighted(u64::MAX, u64::MAX, 0, 0, &Weights::UNIT),
            MAX_LUA_INT
        );
    }

    #[test]
    fn output_tokens_for_cost_inverts_the_output_weight() {
        let w = Weights {
            output: 4.0,
            ..Weights::UNIT
        };
        assert_eq!(output_tokens_for_cost(400, &w), 100);
        assert_eq!(output_tokens_for_cost(403, &w), 100);
        assert_eq!(output_tokens_for_cost(weighted(0, 37, 0, 0, &w), &w), 37);
        assert_eq!(
            output_tokens_for_cost(5, &Weights { output: 0.0, ..w }),
            u64::MAX
        );
    }

    #[test]
    fn clamped_output_tokens_divides_what_is_left_by_every_choice() {
        let w4 = Weights {
            output: 4.0,
            ..Weights::UNIT
        };
        // The review's case: 993 left after the prompt, output weight 4, n = 2 -> 124 per choice.
        assert_eq!(clamped_output_tokens(993, &w4, 2), 124);
        assert_eq!(clamped_output_tokens(993, &w4, 1), 248);
        assert_eq!(
            clamped_output_tokens(993, &w4, 0),
            248,
            "0 choices count as 1"
        );
        assert_eq!(min_clamped_output_cost(&w4, 2), 8);
        assert_eq!(min_clamped_output_cost(&Weights::UNIT, 1), 1);
        assert_eq!(
            clamped_output_tokens(5, &Weights { output: 0.0, ..w4 }, 3),
            u64::MAX
        );
        // Never more than granted, for awkward weights, and at least one token per choice whenever
        // the grant reaches the clamping minimum.
        for ow in [0.25, 0.5, 1.0, 1.1, 3.0, 4.0, 7.3] {
            let w = Weights {
                output: ow,
                ..Weights::UNIT
            };
            for n in 1..=6 {
                for granted in 0..200 {
                    let t = clamped_output_tokens(granted, &w, n);
                    assert!(
                        weighted(0, t * n, 0, 0, &w) <= granted,
                        "ow {ow} n {n} granted {granted} -> {t}"
                    );
                    if granted >= min_clamped_output_cost(&w, n) {
                        assert!(t >= 1, "ow {ow} n {n} granted {granted}");
                    }
                }
            }
        }
    }
}
