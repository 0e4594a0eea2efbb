//! Tests of the estimator: the body walk per API family, text counting, the fast walk against the
//! reference walk.

use super::classes::*;
use super::parts::*;
use super::tables::*;
use super::text::*;
use super::top::*;
use super::whole::*;
use super::*;
use serde_json::Value;

/// The role token of a chat message (`user`, `assistant`, … are one o200k token each).
const ROLE: u64 = 1;

fn limits(_: Option<&str>) -> OutputLimits {
    OutputLimits {
        default_tokens: 1000,
        cap_tokens: 4000,
    }
}

fn est(kind: ApiKind, body: &str) -> Result<Estimate, EstimateError> {
    estimate(kind, body.as_bytes(), &limits)
}

fn ok(kind: ApiKind, body: &str) -> Estimate {
    match est(kind, body) {
        Ok(e) => e,
        Err(e) => panic!("{body}: {e}"),
    }
}

/// A deterministic xorshift64 stream for generated cases: steps `x` and returns it.
pub(super) fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

#[cfg(feature = "exact")]
mod exact;
mod fast;
mod parts;
mod text;
mod walk;
