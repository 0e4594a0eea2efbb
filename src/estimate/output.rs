//! The output reservation: what a request may generate, from the body's output limits and choices.

use super::shape::Num;
use super::{EstimateError, Res, MAX_N};

/// The largest present (non-null) of `max_tokens`, `max_completion_tokens`, `max_output_tokens`
/// (a body that sends two asks for the larger: the reservation errs towards charging); the first
/// bad one, in that order, is an error.
pub(super) fn requested_output(
    max_tokens: Num,
    max_completion_tokens: Num,
    max_output_tokens: Num,
) -> Res<Option<u64>> {
    let mut max = None;
    for (num, field) in [
        (max_tokens, "max_tokens"),
        (max_completion_tokens, "max_completion_tokens"),
        (max_output_tokens, "max_output_tokens"),
    ] {
        match num {
            Num::Absent => continue,
            Num::Val(v) => max = Some(max.map_or(v, |m: u64| m.max(v))),
            Num::Bad => return Err(EstimateError::BadField(field)),
        }
    }
    Ok(max)
}

/// Completions billed per request: `n` (1 when absent), or legacy completions' `best_of` if larger
/// (the provider generates, and bills, `best_of` completions server-side), capped at [`MAX_N`].
pub(super) fn choices(n: Num, best_of: Num) -> Res<u64> {
    let count = |num: Num, field: &'static str| match num {
        Num::Absent => Ok(1),
        Num::Val(v) => Ok(v.clamp(1, MAX_N)),
        Num::Bad => Err(EstimateError::BadField(field)),
    };
    Ok(count(n, "n")?.max(count(best_of, "best_of")?))
}
