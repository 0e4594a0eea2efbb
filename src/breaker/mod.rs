//! Circuit breaker per upstream key (model, cluster, provider…): a pure state machine whose state lives
//! in Envoy shared data, so every worker sees the same breaker.
//!
//! Nothing here reads a clock or talks to Envoy: time comes in as `now_ns` (nanoseconds since the epoch)
//! and shared data is reached through [`SharedStore`]. The flow calls [`admit_shared`] before it sends a
//! request to a key, [`classify`] + [`retry_after_ms`] on the response, then [`record_shared`] (or
//! [`record_batch_shared`], which also adds the successes a worker gathered). For the request breakers,
//! `crate::breaker::failover` reads a breaker's key only when [`open_set`] names it.
//!
//! # Transitions
//!
//! ```text
//!              failures in window >= failure_threshold, or
//!              failure rate >= failure_rate_percent over >= min_requests
//!    CLOSED -----------------------------------------------------------> OPEN
//!      ^                                                                 |  ^
//!      |                                  first admit at or after        |  |  any probe fails: next recovery
//!      |                                  open_until (= probe #1)        v  |  x backoff_multiplier, <= max_recovery_ms
//!      +------------------------------------------------------------ HALF_OPEN
//!         half_open_successes_to_close probe successes               (permits expire probe_timeout_ms after
//!         (window cleared, recovery back to recovery_ms)              the latest one, then are reissued)
//! ```
//!
//! * CLOSED admits everything. Failures and (only when a rate threshold is configured) successes are
//!   counted in a sliding window made of [`BUCKETS`] sub-windows of `window_ms / BUCKETS` each; each
//!   sub-window remembers its epoch index (`now / bucket width`), so a stale one is recognised and
//!   reset instead of being summed. The window therefore covers between 11/12 and 12/12 of `window_ms`.
//! * OPEN rejects with the time left until `open_until`. The first [`admit`] at or after `open_until`
//!   moves to HALF_OPEN and is itself the first probe.
//! * HALF_OPEN admits exactly `half_open_max_calls` probes per round; everything else is rejected.
//!   `half_open_successes_to_close` probe successes (default 1) close the breaker with an empty window
//!   and the recovery reset to `recovery_ms`; any probe failure re-opens it with the next, longer
//!   recovery (`recovery_ms × backoff_multiplier^(opens−1)`, capped at `max_recovery_ms`).
//!
//! # Why probes are counted in shared state
//! Every worker VM runs its own copy of this code. A per-worker permit count would let each of N workers
//! send `half_open_max_calls` probes to an upstream that is just recovering. The permit counter is a field
//! of the shared record, taken in the same CAS read-modify-write that makes the decision, so the limit
//! holds across all workers (see the `two_workers_…` tests).
//!
//! # Probe-timeout escape
//! A probe whose outcome never arrives (client disconnected, VM restarted) would hold its permit forever
//! and wedge HALF_OPEN. Permits therefore expire: once `probe_timeout_ms` have passed since the most
//! recent permit was issued, every permit of the round is void and new probes are admitted. Successes
//! already counted are kept. A probe outcome that arrives late is still honoured (a success counts toward
//! closing, a failure re-opens): it is a fresh observation of the upstream either way. A probe whose
//! response classifies as neither success nor failure (a 400, say) also keeps its permit until it expires.
//!
//! # How Retry-After composes
//! A failure may carry `retry_after_ms` (from `Retry-After` / `x-ratelimit-reset-*`, see
//! [`retry_after_ms`]; capped at `max_recovery_ms` here too). The breaker never re-admits before the
//! upstream asked: `open_until = max(now + recovery, now + retry_after)`.
//! * CLOSED: the failure is counted; the deadline is remembered (`retry_until`) and used if the breaker
//!   trips later while it is still in the future. A 429 alone does not open the breaker.
//! * HALF_OPEN probe failure: the re-open uses the larger of grown recovery and retry-after.
//! * OPEN: a late failure (a request admitted before the breaker opened) can only push `open_until` later.
//!
//! # Encoding (version 1, little-endian, fixed width [`ENCODED_LEN`] = 238 bytes)
//!
//! ```text
//! offset size field
//!      0    1 version = 1
//!      1    1 state: 0 closed, 1 open, 2 half-open
//!      2    4 opens: u32, consecutive opens since the last close (drives the backoff)
//!      6    4 probes_issued: u32, probe permits taken in this half-open round
//!     10    4 probe_successes: u32, probe successes in this half-open episode
//!     14    8 open_until_ns: u64, OPEN: earliest moment for HALF_OPEN
//!     22    8 retry_until_ns: u64, CLOSED: latest Retry-After deadline seen (0 = none)
//!     30    8 last_probe_ns: u64, when the latest probe permit was issued
//!     38    8 bucket_ns: u64, sub-window width the buckets were counted with (config change => reset)
//!     46  192 12 × { epoch: u64, successes: u32, failures: u32 }
//! ```
//! Any other length, version or state byte decodes to `None` (corrupt): [`store::update`] then starts from
//! a fresh CLOSED state and flags it; the wrappers here rewrite the key so it is flagged only once.
//!
//! # Keys
//! `tg:cb:<scope>=<name>` (see [`key`]). Shared data never evicts keys: the caller bounds the number of
//! distinct names (configured models/clusters), never derives them from request data without a bound.
//!
//! # Parts
//! `machine.rs` (config, states, [`admit`], [`record`], [`record_successes`], [`peek_state`]),
//! `window.rs` (the sliding window), `codec.rs` (the encoding above, and the in-place update of one
//! sub-window that [`add_successes_shared`] writes a worker's gathered successes with: 16 bytes of the
//! record touched, the rest neither decoded nor encoded), `shared.rs` (the CAS wrappers and [`key`]), [`open_set`] (one shared value naming the breakers that are not CLOSED, so that a request
//! through closed breakers reads nothing else) and `outcome.rs` ([`classify`], [`retry_after_ms`]);
//! everything is re-exported here.
//!
//! [`SharedStore`]: crate::store::SharedStore
//! [`store::update`]: crate::store::update

mod codec;
pub mod failover;
mod machine;
pub mod open_set;
mod outcome;
mod shared;
mod window;

pub use codec::{ENCODED_LEN, VERSION};
pub use machine::{
    admit, peek_state, record, record_successes, release_probe, Admission, BreakerConfig,
    BreakerState, Outcome, State, Transition, HALF_OPEN_RETRY_MS,
};
pub use open_set::{OpenSet, View, OPEN_SET_KEY};
pub use outcome::{classify, cut_after_response_started, retry_after_ms, FailurePolicy};
pub use shared::{
    add_successes_shared, admit_shared, key, record_batch_shared, record_is_noop, record_shared,
    release_probe_shared, Written, MAX_NAME_BYTES, MAX_SCOPE_BYTES,
};
pub use window::BUCKETS;

const NS_PER_MS: u64 = 1_000_000;

/// Helpers shared by the breaker tests of every part.
#[cfg(test)]
mod testing {
    use super::*;

    pub(super) const S: u64 = 1_000_000_000;
    pub(super) const T0: u64 = 1_700_000_000 * S;

    pub(super) fn cfg() -> BreakerConfig {
        BreakerConfig::default()
    }

    pub(super) fn fail() -> Outcome {
        Outcome::Failure {
            retry_after_ms: None,
        }
    }

    pub(super) fn fail_ra(ms: u64) -> Outcome {
        Outcome::Failure {
            retry_after_ms: Some(ms),
        }
    }

    /// Applies `record` and keeps the state (unchanged when nothing is written).
    pub(super) fn rec(
        s: &mut BreakerState,
        c: &BreakerConfig,
        o: Outcome,
        probe: bool,
        now: u64,
    ) -> Option<Transition> {
        let (next, t) = record(s, c, o, probe, now);
        if let Some(n) = next {
            *s = n;
        }
        t
    }

    pub(super) fn adm(
        s: &mut BreakerState,
        c: &BreakerConfig,
        now: u64,
    ) -> (Admission, Option<Transition>) {
        let (a, next, t) = admit(s, c, now);
        if let Some(n) = next {
            *s = n;
        }
        (a, t)
    }

    /// A CLOSED breaker opened by `failure_threshold` failures at `T0`.
    pub(super) fn opened(c: &BreakerConfig) -> BreakerState {
        let mut s = BreakerState::default();
        for _ in 0..c.failure_threshold {
            rec(&mut s, c, fail(), false, T0);
        }
        assert_eq!(s.state(), State::Open);
        s
    }

    /// An OPEN breaker moved to HALF_OPEN at `at` by one probe admission.
    pub(super) fn half_open_at(c: &BreakerConfig, at: u64) -> BreakerState {
        let mut s = opened(c);
        let (a, t) = adm(&mut s, c, at);
        assert_eq!(a, Admission::Probe);
        assert_eq!(t.map(|t| t.to), Some(State::HalfOpen));
        s
    }
}
