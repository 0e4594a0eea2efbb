//! Settlement arithmetic, pure: from what was reserved and how the response ended to what the tenant is
//! charged (`actual`) and the correction sent to Redis (`delta = actual − reserved`).
//!
//! | how the response ended                                   | charged                              | usage_source |
//! |----------------------------------------------------------|--------------------------------------|--------------|
//! | complete, provider reported `usage`                      | weighted usage                       | provider     |
//! | complete, no `usage`                                     | the reservation (prompt + output)    | estimate     |
//! | not served: non-2xx from the provider or Envoy's own reply | 0 (full refund)                     | none         |
//! | cut mid-way (client abort, upstream cut), usage known    | weighted usage                       | provider     |
//! | cut mid-way, no usage                                    | prompt + output estimated from the bytes streamed, at most the reservation | estimate |
//! | client gone after the request was sent, no final usage (`abandoned_charge` `"reservation"`, the default) | the reservation, or prompt + output from the bytes that arrived if more | estimate |
//! | the same with `"received"` (before any response: a cut with 0 bytes) | prompt + output estimated from the bytes that reached Envoy | estimate |

use crate::quota::{weighted, Weights};
use crate::usage::Usage;

/// What was reserved for one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reserved {
    /// Weighted cost of the prompt estimate.
    pub prompt_cost: u64,
    /// Weighted cost of the output granted.
    pub output_cost: u64,
    /// The model's weights.
    pub weights: Weights,
}

impl Reserved {
    /// Total reserved.
    pub fn total(&self) -> u64 {
        self.prompt_cost.saturating_add(self.output_cost)
    }
}

/// How the response ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Ending {
    /// A 2xx response that completed.
    Completed {
        /// Usage reported by the provider.
        usage: Option<Usage>,
    },
    /// The provider did not serve it (non-2xx, or Envoy answered for it).
    NotServed,
    /// The client left after the request was sent upstream, before the provider's final usage arrived:
    /// charged the whole reservation (`quota.abandoned_charge` `"reservation"`), or the prompt and the
    /// output estimated from the bytes that arrived where that is more (a provider that generated past
    /// the output reserved, reading the limit otherwise than tokengate did).
    Abandoned {
        /// Bytes of generated text seen.
        content_bytes: u64,
    },
    /// A 2xx response cut before its end.
    Cut {
        /// Usage, if it arrived before the cut.
        usage: Option<Usage>,
        /// Bytes of generated text seen.
        content_bytes: u64,
    },
}

/// Where the charged number comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageSource {
    /// The provider's `usage`.
    Provider,
    /// Our estimate.
    Estimate,
    /// Nothing charged.
    None,
}

impl UsageSource {
    /// For the audit record.
    pub fn as_str(self) -> &'static str {
        match self {
            UsageSource::Provider => "provider",
            UsageSource::Estimate => "estimate",
            UsageSource::None => "none",
        }
    }
}

/// The settlement of one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settlement {
    /// Weighted tokens charged in the end.
    pub actual: u64,
    /// `actual − reserved`: negative is a refund.
    pub delta: i64,
    /// Where `actual` comes from.
    pub source: UsageSource,
}

fn of_usage(u: &Usage, w: &Weights) -> u64 {
    weighted(
        u.prompt_tokens,
        u.completion_tokens,
        u.cached_tokens,
        u.reasoning_tokens,
        w,
    )
}

/// The provider's input and output tokens of a response that ended so (its `usage`'s prompt and
/// completion tokens, cached and reasoning ones included), `(0, 0)` when the provider reported none:
/// a refund, an estimate, an abandoned answer. What the input/output split in Redis adds.
pub fn tokens_io(ending: Ending) -> (u64, u64) {
    match ending {
        Ending::Completed { usage: Some(u) } | Ending::Cut { usage: Some(u), .. } => {
            (u.prompt_tokens, u.completion_tokens)
        }
        _ => (0, 0),
    }
}

/// Settles a reservation.
pub fn settle(r: &Reserved, ending: Ending) -> Settlement {
    let (actual, source) = match ending {
        Ending::Completed { usage: Some(u) } | Ending::Cut { usage: Some(u), .. } => {
            (of_usage(&u, &r.weights), UsageSource::Provider)
        }
        Ending::Completed { usage: None } => (r.total(), UsageSource::Estimate),
        Ending::Abandoned { content_bytes } => {
            let out_tokens = crate::usage::estimate_tokens_from_bytes(content_bytes);
            let streamed = r
                .prompt_cost
                .saturating_add(weighted(0, out_tokens, 0, 0, &r.weights));
            (r.total().max(streamed), UsageSource::Estimate)
        }
        Ending::NotServed => (0, UsageSource::None),
        Ending::Cut {
            usage: None,
            content_bytes,
        } => {
            let out_tokens = crate::usage::estimate_tokens_from_bytes(content_bytes);
            let out = weighted(0, out_tokens, 0, 0, &r.weights).min(r.output_cost);
            (r.prompt_cost.saturating_add(out), UsageSource::Estimate)
        }
    };
    let delta = i128::from(actual) - i128::from(r.total());
    Settlement {
        actual,
        delta: i64::try_from(delta).unwrap_or(if delta < 0 { i64::MIN } else { i64::MAX }),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r() -> Reserved {
        Reserved {
            prompt_cost: 100,
            output_cost: 1000,
            weights: Weights::UNIT,
        }
    }

    fn usage(p: u64, c: u64) -> Usage {
        Usage {
            prompt_tokens: p,
            completion_tokens: c,
            ..Usage::estimate(0, 0)
        }
    }

    #[test]
    fn completed_with_usage_charges_exactly_the_usage() {
        let s = settle(
            &r(),
            Ending::Completed {
                usage: Some(usage(90, 40)),
            },
        );
        assert_eq!(s.actual, 130);
        assert_eq!(s.delta, 130 - 1100);
        assert_eq!(s.source, UsageSource::Provider);
    }

    #[test]
    fn an_abandoned_request_is_charged_its_whole_reservation() {
        let s = settle(&r(), Ending::Abandoned { content_bytes: 400 });
        assert_eq!((s.actual, s.delta), (1100, 0));
        assert_eq!(s.source, UsageSource::Estimate);
        // More arrived than the output reserved (the provider read the limit otherwise): that is charged.
        let s = settle(
            &r(),
            Ending::Abandoned {
                content_bytes: 8000,
            },
        );
        assert_eq!((s.actual, s.delta), (100 + 2000, 1000));
    }

    #[test]
    fn completed_without_usage_keeps_the_reservation_as_estimate() {
        let s = settle(&r(), Ending::Completed { usage: None });
        assert_eq!(
            (s.actual, s.delta, s.source),
            (1100, 0, UsageSource::Estimate)
        );
    }

    #[test]
    fn upstream_failure_refunds_everything() {
        let s = settle(&r(), Ending::NotServed);
        assert_eq!((s.actual, s.delta), (0, -1100));
    }

    #[test]
    fn a_cut_stream_charges_prompt_plus_streamed_output_at_most_the_reservation() {
        let s = settle(
            &r(),
            Ending::Cut {
                usage: None,
                content_bytes: 400,
            },
        );
        assert_eq!(s.source, UsageSource::Estimate);
        assert!(s.actual > 100 && s.actual < 1100, "{}", s.actual);
        let s = settle(
            &r(),
            Ending::Cut {
                usage: None,
                content_bytes: 10_000_000,
            },
        );
        assert_eq!(s.actual, 1100);
    }

    #[test]
    fn weights_apply_to_usage() {
        let mut rr = r();
        rr.weights = Weights {
            input: 1.0,
            output: 4.0,
            cached_input: 0.5,
            reasoning: 4.0,
        };
        let s = settle(
            &rr,
            Ending::Completed {
                usage: Some(usage(10, 10)),
            },
        );
        assert_eq!(s.actual, 50);
    }
}
