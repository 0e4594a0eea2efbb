//! Token-bucket math, pure: `(state, cost, now) -> (verdict, new state)`.
//!
//! One bucket record holds two buckets that refill continuously from the same timestamp:
//! * tokens: capacity `burst`, refilled at `tokens_per_second`, charged the request's estimated cost;
//! * requests (optional): capacity `requests_per_minute`, refilled at `rpm / 60` per second, charged 1.
//!
//! A request is admitted only when *both* hold enough, and then both are charged in the same write, so
//! over any window `[t0, t1]` the tokens admitted never exceed `burst + rate × (t1 − t0)`.
//!
//! Shaping (`max_wait_ms > 0`): when the bucket lacks tokens but refill would cover the deficit within
//! `max_wait_ms`, the charge is taken now (the balance goes negative: a debt later requests must wait
//! out) and the verdict says how long to hold the request. The bound above still holds for the instant
//! the held request is released.
//!
//! Encoding (25 bytes, little-endian): `[version=1][tokens f64][requests f64][updated_ns u64]`.

use crate::store::{read_f64, read_u64, Codec};

/// Rates of one rule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BucketParams {
    /// Refill rate of the token bucket, tokens per second.
    pub tokens_per_second: f64,
    /// Capacity of the token bucket.
    pub burst: f64,
    /// Capacity and per-minute refill of the request bucket, if any.
    pub requests_per_minute: Option<f64>,
}

/// Stored state of one bucket record.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BucketState {
    /// Token balance (negative while shaped requests are being paid off).
    pub tokens: f64,
    /// Request balance.
    pub requests: f64,
    /// When the balances were last brought up to date, ns since the epoch.
    pub updated_ns: u64,
}

const VERSION: u8 = 1;
const LEN: usize = 25;

impl Codec for BucketState {
    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(LEN);
        v.push(VERSION);
        v.extend_from_slice(&self.tokens.to_le_bytes());
        v.extend_from_slice(&self.requests.to_le_bytes());
        v.extend_from_slice(&self.updated_ns.to_le_bytes());
        v
    }
    fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != LEN || b.first() != Some(&VERSION) {
            return None;
        }
        Some(BucketState {
            tokens: read_f64(b, 1)?,
            requests: read_f64(b, 9)?,
            updated_ns: read_u64(b, 17)?,
        })
    }
}

/// What a snapshot of the bucket says, for `x-ratelimit-*` headers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Snapshot {
    /// `x-ratelimit-limit-tokens`.
    pub limit_tokens: f64,
    /// Whole tokens left (never negative).
    pub remaining_tokens: u64,
    /// Seconds until the token bucket is full again.
    pub reset_tokens_s: f64,
    /// Request limit, remaining and reset, when the rule has requests/minute.
    pub requests: Option<(f64, u64, f64)>,
}

/// The decision for one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Verdict {
    /// Charged; go now.
    Admit,
    /// Charged; hold the request this long first (shaping).
    Wait {
        /// How long to hold, ms.
        wait_ms: u64,
    },
    /// Not charged: not enough tokens; seconds until there would be.
    LimitTokens {
        /// Seconds until the request would fit.
        reset_in_s: f64,
    },
    /// Not charged: requests/minute spent; seconds until one is back.
    LimitRequests {
        /// Seconds until the request would fit.
        reset_in_s: f64,
    },
    /// Not charged: the cost is larger than the burst and can never fit.
    TooLarge,
}

impl BucketState {
    /// A full bucket at `now_ns`.
    pub fn full(p: &BucketParams, now_ns: u64) -> Self {
        BucketState {
            tokens: p.burst,
            requests: p.requests_per_minute.unwrap_or(0.0),
            updated_ns: now_ns,
        }
    }

    /// The balances brought up to `now_ns` (a clock that went backwards refills nothing).
    pub fn refilled(&self, p: &BucketParams, now_ns: u64) -> Self {
        let dt = now_ns.saturating_sub(self.updated_ns) as f64 / 1e9;
        let tokens = (self.tokens + dt * p.tokens_per_second).min(p.burst);
        let requests = match p.requests_per_minute {
            Some(rpm) => (self.requests + dt * rpm / 60.0).min(rpm),
            None => 0.0,
        };
        BucketState {
            tokens,
            requests,
            updated_ns: self.updated_ns.max(now_ns),
        }
    }

    /// Header values for this (already refilled) state.
    pub fn snapshot(&self, p: &BucketParams) -> Snapshot {
        Snapshot {
            limit_tokens: p.burst,
            remaining_tokens: floor_u64(self.tokens),
            reset_tokens_s: ((p.burst - self.tokens) / p.tokens_per_second).max(0.0),
            requests: p.requests_per_minute.map(|rpm| {
                (
                    rpm,
                    floor_u64(self.requests),
                    ((rpm - self.requests) * 60.0 / rpm).max(0.0),
                )
            }),
        }
    }
}

fn floor_u64(x: f64) -> u64 {
    if x.is_finite() && x > 0.0 {
        x.floor() as u64
    } else {
        0
    }
}

/// Charges `cost` tokens and one request at `now_ns`, or explains why not.
///
/// Returns the verdict, the snapshot to report, and the state to store (`None` = write nothing: the
/// request was not charged and refill is implicit in the timestamp).
pub fn charge(
    state: &BucketState,
    p: &BucketParams,
    cost: u64,
    now_ns: u64,
    max_wait_ms: u64,
) -> (Verdict, Snapshot, Option<BucketState>) {
    let s = state.refilled(p, now_ns);
    let cost = cost as f64;
    if cost > p.burst {
        return (Verdict::TooLarge, s.snapshot(p), None);
    }
    let token_wait_s = ((cost - s.tokens) / p.tokens_per_second).max(0.0);
    let req_wait_s = match p.requests_per_minute {
        Some(rpm) => ((1.0 - s.requests) * 60.0 / rpm).max(0.0),
        None => 0.0,
    };
    let wait_s = token_wait_s.max(req_wait_s);
    let max_wait_s = max_wait_ms as f64 / 1000.0;
    if wait_s > 0.0 && wait_s > max_wait_s {
        // Name the bucket that is short; requests first when it alone needs the longer wait.
        let verdict = if req_wait_s > token_wait_s {
            Verdict::LimitRequests {
                reset_in_s: req_wait_s,
            }
        } else {
            Verdict::LimitTokens {
                reset_in_s: token_wait_s,
            }
        };
        return (verdict, s.snapshot(p), None);
    }
    let next = BucketState {
        tokens: s.tokens - cost,
        requests: if p.requests_per_minute.is_some() {
            s.requests - 1.0
        } else {
            0.0
        },
        updated_ns: s.updated_ns,
    };
    let verdict = if wait_s > 0.0 {
        Verdict::Wait {
            wait_ms: (wait_s * 1000.0).ceil() as u64,
        }
    } else {
        Verdict::Admit
    };
    (verdict, next.snapshot(p), Some(next))
}

/// Headers-phase check without charging: is the bucket already too short for *any* request (less than
/// one token or one request available within `max_wait_ms`)? Returns the limiting verdict if so.
pub fn precheck(
    state: &BucketState,
    p: &BucketParams,
    now_ns: u64,
    max_wait_ms: u64,
) -> Option<(Verdict, Snapshot)> {
    let (v, snap, _) = charge(state, p, 1, now_ns, max_wait_ms);
    match v {
        Verdict::LimitTokens { .. } | Verdict::LimitRequests { .. } => Some((v, snap)),
        _ => None,
    }
}

/// Gives back `amount` tokens (actual usage came in below the estimate), never above `burst`.
pub fn credit(state: &BucketState, p: &BucketParams, amount: u64, now_ns: u64) -> BucketState {
    let s = state.refilled(p, now_ns);
    BucketState {
        tokens: (s.tokens + amount as f64).min(p.burst),
        ..s
    }
}

/// Takes `amount` tokens after the fact (usage above what was charged): the balance may go into debt,
/// at most one burst deep, which later requests wait out like shaping debt.
pub fn debit(state: &BucketState, p: &BucketParams, amount: u64, now_ns: u64) -> BucketState {
    let s = state.refilled(p, now_ns);
    BucketState {
        tokens: (s.tokens - amount as f64).max(-p.burst),
        ..s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const S: u64 = 1_000_000_000;

    fn p(rate: f64, burst: f64, rpm: Option<f64>) -> BucketParams {
        BucketParams {
            tokens_per_second: rate,
            burst,
            requests_per_minute: rpm,
        }
    }

    #[test]
    fn debits_go_into_debt_at_most_one_burst_deep() {
        let p = p(10.0, 100.0, None);
        let s = BucketState::full(&p, 0);
        let d = debit(&s, &p, 150, 0);
        assert_eq!(d.tokens, -50.0);
        assert_eq!(debit(&d, &p, 1000, 0).tokens, -100.0);
        // Debt refills like any shortfall: 10 tokens/s.
        assert_eq!(d.refilled(&p, 5 * S).tokens, 0.0);
    }

    #[test]
    fn full_bucket_admits_up_to_burst_then_limits() {
        let pp = p(10.0, 100.0, None);
        let s = BucketState::full(&pp, 0);
        let (v, snap, s) = charge(&s, &pp, 60, 0, 0);
        assert_eq!(v, Verdict::Admit);
        assert_eq!(snap.remaining_tokens, 40);
        let s = s.unwrap();
        let (v, snap, w) = charge(&s, &pp, 60, 0, 0);
        assert!(w.is_none());
        assert_eq!(snap.remaining_tokens, 40);
        match v {
            Verdict::LimitTokens { reset_in_s } => assert!((reset_in_s - 2.0).abs() < 1e-9),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bucket_refills_to_capacity_after_idle_period() {
        let pp = p(10.0, 100.0, None);
        let s = BucketState {
            tokens: 0.0,
            requests: 0.0,
            updated_ns: 0,
        };
        assert_eq!(s.refilled(&pp, 5 * S).tokens, 50.0);
        assert_eq!(s.refilled(&pp, 500 * S).tokens, 100.0);
    }

    #[test]
    fn clock_going_backwards_refills_nothing_and_keeps_timestamp() {
        let pp = p(10.0, 100.0, None);
        let s = BucketState {
            tokens: 5.0,
            requests: 0.0,
            updated_ns: 10 * S,
        };
        let r = s.refilled(&pp, 3 * S);
        assert_eq!(r.tokens, 5.0);
        assert_eq!(r.updated_ns, 10 * S);
    }

    #[test]
    fn requests_per_minute_limits_independently_of_tokens() {
        let pp = p(1000.0, 1000.0, Some(2.0));
        let mut s = BucketState::full(&pp, 0);
        for _ in 0..2 {
            let (v, _, n) = charge(&s, &pp, 1, 0, 0);
            assert_eq!(v, Verdict::Admit);
            s = n.unwrap();
        }
        let (v, snap, _) = charge(&s, &pp, 1, 0, 0);
        match v {
            Verdict::LimitRequests { reset_in_s } => assert!((reset_in_s - 30.0).abs() < 1e-6),
            other => panic!("{other:?}"),
        }
        assert_eq!(snap.requests.unwrap().1, 0);
    }

    #[test]
    fn cost_above_burst_is_too_large_and_charges_nothing() {
        let pp = p(10.0, 100.0, None);
        let s = BucketState::full(&pp, 0);
        let (v, _, n) = charge(&s, &pp, 101, 0, 0);
        assert_eq!(v, Verdict::TooLarge);
        assert!(n.is_none());
    }

    #[test]
    fn shaping_charges_now_and_says_how_long_to_wait() {
        let pp = p(100.0, 100.0, None);
        let s = BucketState::full(&pp, 0);
        let (_, _, s) = charge(&s, &pp, 100, 0, 500);
        let (v, _, n) = charge(&s.unwrap(), &pp, 30, 0, 500);
        assert_eq!(v, Verdict::Wait { wait_ms: 300 });
        let n = n.unwrap();
        assert_eq!(n.tokens, -30.0);
        // the next one must wait out the debt too, beyond the limit → rejected
        let (v, _, _) = charge(&n, &pp, 30, 0, 500);
        assert_eq!(v, Verdict::Wait { wait_ms: 600 }.max_wait_exceeded(500));
    }

    impl Verdict {
        fn max_wait_exceeded(self, max: u64) -> Verdict {
            match self {
                Verdict::Wait { wait_ms } if wait_ms > max => Verdict::LimitTokens {
                    reset_in_s: wait_ms as f64 / 1000.0,
                },
                v => v,
            }
        }
    }

    #[test]
    fn precheck_rejects_only_an_empty_bucket() {
        let pp = p(10.0, 100.0, None);
        let s = BucketState {
            tokens: 0.5,
            requests: 0.0,
            updated_ns: 0,
        };
        assert!(precheck(&s, &pp, 0, 0).is_some());
        assert!(precheck(&s, &pp, S / 10, 0).is_none());
        assert!(precheck(&s, &pp, 0, 100).is_none());
    }

    #[test]
    fn credit_gives_back_but_never_above_burst() {
        let pp = p(10.0, 100.0, None);
        let s = BucketState {
            tokens: 10.0,
            requests: 0.0,
            updated_ns: 0,
        };
        assert_eq!(credit(&s, &pp, 50, 0).tokens, 60.0);
        assert_eq!(credit(&s, &pp, 500, 0).tokens, 100.0);
    }

    #[test]
    fn encoding_round_trips_and_rejects_wrong_length_or_version() {
        let s = BucketState {
            tokens: -3.5,
            requests: 2.0,
            updated_ns: 42,
        };
        let b = s.encode();
        assert_eq!(b.len(), 25);
        assert_eq!(BucketState::decode(&b), Some(s));
        assert_eq!(BucketState::decode(&b[..24]), None);
        let mut bad = b.clone();
        bad[0] = 9;
        assert_eq!(BucketState::decode(&bad), None);
        let mut nan = b;
        nan[1..9].copy_from_slice(&f64::NAN.to_le_bytes());
        assert_eq!(BucketState::decode(&nan), None);
    }

    #[test]
    fn admitted_tokens_never_exceed_burst_plus_refill_over_a_window() {
        let pp = p(50.0, 200.0, None);
        let mut s = BucketState::full(&pp, 0);
        let mut admitted = 0u64;
        // one request of 7 tokens every 10 ms for 10 s
        for i in 0..1000u64 {
            let now = i * S / 100;
            let (v, _, n) = charge(&s, &pp, 7, now, 0);
            if v == Verdict::Admit {
                admitted += 7;
                s = n.unwrap();
            }
        }
        let max = 200.0 + 50.0 * 9.99;
        assert!(admitted as f64 <= max, "{admitted} > {max}");
        assert!(admitted as f64 >= max - 14.0, "{admitted} too low");
    }
}
