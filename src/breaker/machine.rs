//! The breaker's state machine: CLOSED → OPEN → HALF_OPEN → CLOSED (or back to OPEN), as pure functions of
//! (state, config, event, now). [`admit`] decides whether a request may go; [`record`] takes its outcome;
//! [`release_probe`] gives back a permit of a request that was not sent; [`peek_state`] reads without
//! writing. Each returns the new state to write (`None` = unchanged) and the transition, if any.

use super::window::{Rule, Window, BUCKETS};
use super::NS_PER_MS;

/// Breaker tuning, already validated (see [`BreakerConfig::validate`]).
///
/// `Default` is the count mode (5 failures in 60 s), what the shim breakers build on. The request
/// breakers' `breaker` section defaults to the rate mode instead (50 % of at least 20 in 30 s, see
/// `crate::config::BreakerMode`).
#[derive(Debug, Clone, PartialEq)]
pub struct BreakerConfig {
    /// Failures within the window that open the breaker (default 5; `u32::MAX`: only the rate opens it).
    pub failure_threshold: u32,
    /// Length of the sliding window in ms (default 60 000; 12 ..= 86 400 000).
    pub window_ms: u64,
    /// Also open when failures / requests in the window reach this percentage (default off here; 50
    /// in a `breaker` section that asks for no count).
    pub failure_rate_percent: Option<u32>,
    /// Requests needed in the window before the rate rule applies (default 20).
    pub min_requests: u32,
    /// Time OPEN before the first probe, for the first open after a close (default 30 000 ms).
    pub recovery_ms: u64,
    /// Cap for the grown recovery, and for any Retry-After (default 300 000 ms).
    pub max_recovery_ms: u64,
    /// Factor applied to the recovery on each re-open without a close in between (default 2.0; 1.0 = fixed).
    pub backoff_multiplier: f64,
    /// Probe permits per HALF_OPEN round, across all workers (default 3).
    pub half_open_max_calls: u32,
    /// Probe successes that close the breaker (default 1; at most `half_open_max_calls`).
    pub half_open_successes_to_close: u32,
    /// A round's permits expire this long after the latest was issued (default 60 000 ms).
    pub probe_timeout_ms: u64,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            failure_threshold: 5,
            window_ms: 60_000,
            failure_rate_percent: None,
            min_requests: 20,
            recovery_ms: 30_000,
            max_recovery_ms: 300_000,
            backoff_multiplier: 2.0,
            half_open_max_calls: 3,
            half_open_successes_to_close: 1,
            probe_timeout_ms: 60_000,
        }
    }
}

impl BreakerConfig {
    /// The part of this config the failure window reads.
    pub(super) fn rule(&self) -> Rule {
        Rule {
            window_ms: self.window_ms,
            failure_threshold: self.failure_threshold,
            failure_rate_percent: self.failure_rate_percent,
            min_requests: self.min_requests,
        }
    }

    /// Checks meaning; the error names the offending field.
    pub fn validate(&self) -> Result<(), String> {
        if self.failure_threshold < 1 {
            return Err("failure_threshold must be >= 1".into());
        }
        if !(BUCKETS as u64..=86_400_000).contains(&self.window_ms) {
            return Err(format!("window_ms must be between {BUCKETS} and 86400000"));
        }
        if let Some(p) = self.failure_rate_percent {
            if !(1..=100).contains(&p) {
                return Err("failure_rate_percent must be between 1 and 100".into());
            }
        }
        if self.min_requests < 1 {
            return Err("min_requests must be >= 1".into());
        }
        if self.recovery_ms < 1 {
            return Err("recovery_ms must be >= 1".into());
        }
        if self.max_recovery_ms < self.recovery_ms {
            return Err("max_recovery_ms must be >= recovery_ms".into());
        }
        if self.max_recovery_ms > 86_400_000 {
            return Err("max_recovery_ms must be <= 86400000".into());
        }
        if !self.backoff_multiplier.is_finite() || self.backoff_multiplier < 1.0 {
            return Err("backoff_multiplier must be a finite number >= 1.0".into());
        }
        if self.half_open_max_calls < 1 {
            return Err("half_open_max_calls must be >= 1".into());
        }
        if self.half_open_successes_to_close < 1
            || self.half_open_successes_to_close > self.half_open_max_calls
        {
            return Err(
                "half_open_successes_to_close must be between 1 and half_open_max_calls".into(),
            );
        }
        if self.probe_timeout_ms < 1 {
            return Err("probe_timeout_ms must be >= 1".into());
        }
        Ok(())
    }

    /// Recovery in ms for the `opens`-th consecutive open (1 = first): `recovery_ms ×
    /// backoff_multiplier^(opens−1)`, capped at `max_recovery_ms`.
    pub fn recovery_for(&self, opens: u32) -> u64 {
        let cap = self.max_recovery_ms;
        let exp = i32::try_from(opens.saturating_sub(1).min(1024)).unwrap_or(1024);
        let grown = self.recovery_ms as f64 * self.backoff_multiplier.powi(exp);
        if !grown.is_finite() || grown >= cap as f64 {
            cap
        } else {
            // `as` saturates; `grown` is finite and below `cap` here.
            (grown as u64).min(cap)
        }
    }
}

/// The breaker's position in the state machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum State {
    /// Requests flow; failures are counted.
    #[default]
    Closed,
    /// Requests are rejected until the recovery (or Retry-After) has passed.
    Open,
    /// A bounded number of probes test the upstream.
    HalfOpen,
}

impl State {
    /// Lower-case name for logs and headers: `closed`, `open`, `half_open`.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Closed => "closed",
            State::Open => "open",
            State::HalfOpen => "half_open",
        }
    }

    /// Value for a gauge metric: closed 0, open 1, half-open 2.
    pub fn as_gauge(self) -> u64 {
        match self {
            State::Closed => 0,
            State::Open => 1,
            State::HalfOpen => 2,
        }
    }

    pub(super) fn to_byte(self) -> u8 {
        self.as_gauge() as u8
    }

    pub(super) fn from_byte(b: u8) -> Option<Self> {
        match b {
            0 => Some(State::Closed),
            1 => Some(State::Open),
            2 => Some(State::HalfOpen),
            _ => None,
        }
    }
}

/// The shared record of one breaker. `Default` is a fresh CLOSED breaker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BreakerState {
    pub(super) state: State,
    /// Consecutive opens since the last close (drives the backoff).
    pub(super) opens: u32,
    /// Probe permits taken in this half-open round.
    pub(super) probes_issued: u32,
    /// Probe successes in this half-open episode.
    pub(super) probe_successes: u32,
    /// OPEN: earliest moment for HALF_OPEN.
    pub(super) open_until_ns: u64,
    /// CLOSED: latest Retry-After deadline seen (0 = none).
    pub(super) retry_until_ns: u64,
    /// When the latest probe permit was issued.
    pub(super) last_probe_ns: u64,
    /// The failure window.
    pub(super) window: Window,
}

impl BreakerState {
    /// The stored state, without applying time (see [`peek_state`] for "right now").
    pub fn state(&self) -> State {
        self.state
    }

    /// Consecutive opens since the last close (0 when closed after a success).
    pub fn opens(&self) -> u32 {
        self.opens
    }

    /// (successes, failures) in the window ending at `now_ns`, as counted under `cfg`.
    pub fn window_counts(&self, cfg: &BreakerConfig, now_ns: u64) -> (u64, u64) {
        self.window.counts(&cfg.rule(), now_ns)
    }

    /// Enters OPEN for the next consecutive open, honouring any pending Retry-After deadline.
    fn open(&mut self, cfg: &BreakerConfig, now_ns: u64) {
        self.opens = self.opens.saturating_add(1);
        let recovery_ns = cfg.recovery_for(self.opens).saturating_mul(NS_PER_MS);
        self.state = State::Open;
        self.open_until_ns = now_ns.saturating_add(recovery_ns).max(self.retry_until_ns);
        self.retry_until_ns = 0;
        self.probes_issued = 0;
        self.probe_successes = 0;
    }

    /// Back to CLOSED with an empty window and the backoff reset.
    fn close(&mut self) {
        *self = BreakerState {
            window: self.window.cleared(),
            ..BreakerState::default()
        };
    }

    /// Voids the round's permits once `probe_timeout_ms` passed since the latest one was issued.
    fn expire_probes(&mut self, cfg: &BreakerConfig, now_ns: u64) {
        if self.probes_issued > 0 && now_ns >= self.probes_expire_at(cfg) {
            self.probes_issued = 0;
        }
    }

    fn probes_expire_at(&self, cfg: &BreakerConfig) -> u64 {
        self.last_probe_ns
            .saturating_add(cfg.probe_timeout_ms.saturating_mul(NS_PER_MS))
    }
}

/// What [`admit`] decided for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// CLOSED: send it.
    Allowed,
    /// HALF_OPEN: send it as a probe; report its outcome with `was_probe = true`.
    Probe,
    /// OPEN (or HALF_OPEN with every permit taken): do not send; a new attempt may succeed in about
    /// `reset_in_ms` (for HALF_OPEN: when the current permits expire at the latest).
    Rejected {
        /// Milliseconds until the breaker may admit again, rounded up.
        reset_in_ms: u64,
    },
}

/// A change of [`State`], for one log line and a counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    /// State before.
    pub from: State,
    /// State after.
    pub to: State,
    /// Why: one of `failure_threshold`, `failure_rate`, `recovery_elapsed`, `probes_succeeded`,
    /// `probe_failed`.
    pub reason: &'static str,
}

const REASON_RECOVERY: &str = "recovery_elapsed";
const REASON_PROBES_OK: &str = "probes_succeeded";
const REASON_PROBE_FAILED: &str = "probe_failed";

/// An upstream result the breaker counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The upstream answered properly.
    Success,
    /// The upstream failed; it may have said when to come back.
    Failure {
        /// Upstream's Retry-After in ms (see [`retry_after_ms`]); capped at `max_recovery_ms`.
        ///
        /// [`retry_after_ms`]: super::retry_after_ms
        retry_after_ms: Option<u64>,
    },
}

impl Outcome {
    /// Attaches a Retry-After to a failure; a success is returned unchanged.
    pub fn with_retry_after(self, retry_after_ms: Option<u64>) -> Self {
        match self {
            Outcome::Success => Outcome::Success,
            Outcome::Failure { .. } => Outcome::Failure { retry_after_ms },
        }
    }
}

fn ms_until(now_ns: u64, deadline_ns: u64) -> u64 {
    deadline_ns.saturating_sub(now_ns).div_ceil(NS_PER_MS)
}

/// The longest `reset_in` / `retry-after` of a request refused while HALF_OPEN's probes are all taken.
pub const HALF_OPEN_RETRY_MS: u64 = 1000;

/// Decides whether a request may go to this breaker's key now.
///
/// CLOSED → `Allowed` (nothing to write). OPEN before `open_until` → `Rejected`; at or after it the
/// breaker moves to HALF_OPEN and this request is its first probe. HALF_OPEN → `Probe` while permits
/// remain (the permit is taken in the returned state), else `Rejected`. Returns the new state to write
/// (`None` = unchanged) and the transition, if any.
pub fn admit(
    state: &BreakerState,
    cfg: &BreakerConfig,
    now_ns: u64,
) -> (Admission, Option<BreakerState>, Option<Transition>) {
    match state.state {
        State::Closed => (Admission::Allowed, None, None),
        State::Open => {
            if now_ns < state.open_until_ns {
                let reset_in_ms = ms_until(now_ns, state.open_until_ns);
                return (Admission::Rejected { reset_in_ms }, None, None);
            }
            let mut next = *state;
            next.state = State::HalfOpen;
            next.probes_issued = 1;
            next.probe_successes = 0;
            next.last_probe_ns = now_ns;
            let t = Transition {
                from: State::Open,
                to: State::HalfOpen,
                reason: REASON_RECOVERY,
            };
            (Admission::Probe, Some(next), Some(t))
        }
        State::HalfOpen => {
            let mut next = *state;
            next.expire_probes(cfg, now_ns);
            if next.probes_issued < cfg.half_open_max_calls.max(1) {
                next.probes_issued += 1;
                next.last_probe_ns = now_ns;
                (Admission::Probe, Some(next), None)
            } else {
                // The probes usually answer long before their permits expire: clients are told to come
                // back soon rather than after the whole `probe_timeout_ms`.
                let reset_in_ms =
                    ms_until(now_ns, next.probes_expire_at(cfg)).min(HALF_OPEN_RETRY_MS);
                (Admission::Rejected { reset_in_ms }, None, None)
            }
        }
    }
}

/// Records the outcome of a request sent under an earlier [`admit`]; `was_probe` says whether that
/// admission was `Probe`.
///
/// CLOSED: the outcome is counted (a success only when a rate rule is configured, otherwise nothing is
/// written) and may open the breaker. OPEN: only a failure with a later Retry-After changes anything
/// (it extends `open_until`). HALF_OPEN: probe outcomes close or re-open; non-probe outcomes (requests
/// admitted before the breaker opened) are ignored.
pub fn record(
    state: &BreakerState,
    cfg: &BreakerConfig,
    outcome: Outcome,
    was_probe: bool,
    now_ns: u64,
) -> (Option<BreakerState>, Option<Transition>) {
    let retry_deadline = match outcome {
        Outcome::Failure {
            retry_after_ms: Some(ms),
        } => Some(now_ns.saturating_add(ms.min(cfg.max_recovery_ms).saturating_mul(NS_PER_MS))),
        _ => None,
    };
    let mut next = *state;
    match (state.state, outcome) {
        (State::Closed, Outcome::Success) => {
            if cfg.failure_rate_percent.is_none() {
                return (None, None);
            }
            next.window.count(&cfg.rule(), now_ns, true);
            (Some(next), None)
        }
        (State::Closed, Outcome::Failure { .. }) => {
            next.window.count(&cfg.rule(), now_ns, false);
            if let Some(d) = retry_deadline {
                next.retry_until_ns = next.retry_until_ns.max(d);
            }
            let Some(reason) = next.window.trip_reason(&cfg.rule(), now_ns) else {
                return (Some(next), None);
            };
            next.open(cfg, now_ns);
            let t = Transition {
                from: State::Closed,
                to: State::Open,
                reason,
            };
            (Some(next), Some(t))
        }
        (State::Open, _) => match retry_deadline {
            Some(d) if d > state.open_until_ns => {
                next.open_until_ns = d;
                (Some(next), None)
            }
            _ => (None, None),
        },
        (State::HalfOpen, _) if !was_probe => (None, None),
        (State::HalfOpen, Outcome::Success) => {
            next.probe_successes = next.probe_successes.saturating_add(1);
            if next.probe_successes < cfg.half_open_successes_to_close.max(1) {
                return (Some(next), None);
            }
            next.close();
            let t = Transition {
                from: State::HalfOpen,
                to: State::Closed,
                reason: REASON_PROBES_OK,
            };
            (Some(next), Some(t))
        }
        (State::HalfOpen, Outcome::Failure { .. }) => {
            next.retry_until_ns = retry_deadline.unwrap_or(0);
            next.open(cfg, now_ns);
            let t = Transition {
                from: State::HalfOpen,
                to: State::Open,
                reason: REASON_PROBE_FAILED,
            };
            (Some(next), Some(t))
        }
    }
}

/// Counts `n` outcomes that were plain successes (not probes), reported together by one worker
/// (see `crate::breaker::failover`: a worker gathers them and reports them in one write). The same as `n`
/// calls of [`record`] with [`Outcome::Success`] and `was_probe = false` at `now_ns`: only CLOSED with a
/// failure-rate threshold counts them; a success never opens or closes anything.
pub fn record_successes(
    state: &BreakerState,
    cfg: &BreakerConfig,
    n: u32,
    now_ns: u64,
) -> Option<BreakerState> {
    if n == 0 || state.state != State::Closed || cfg.failure_rate_percent.is_none() {
        return None;
    }
    let mut next = *state;
    next.window.add_successes(&cfg.rule(), now_ns, n);
    Some(next)
}

/// Gives back a probe permit taken by [`admit`] for a request that was then not sent (a bucket or the
/// quota refused it after the breaker admitted it), so the next request can probe at once instead of
/// waiting for `probe_timeout_ms`. Only in HALF_OPEN, and never below the probes already answered.
pub fn release_probe(state: &BreakerState) -> Option<BreakerState> {
    if state.state != State::HalfOpen || state.probes_issued <= state.probe_successes {
        return None;
    }
    let mut next = *state;
    next.probes_issued -= 1;
    Some(next)
}

/// Read-only view for headers-phase checks (e.g. on fallback targets) and gauges: the state as it
/// stands at `now_ns` and the ms until it may admit (0 when it would admit now). An OPEN breaker whose
/// recovery has passed reads as HALF_OPEN.
pub fn peek_state(state: &BreakerState, cfg: &BreakerConfig, now_ns: u64) -> (State, u64) {
    match state.state {
        State::Closed => (State::Closed, 0),
        State::Open if now_ns >= state.open_until_ns => (State::HalfOpen, 0),
        State::Open => (State::Open, ms_until(now_ns, state.open_until_ns)),
        State::HalfOpen => {
            let mut s = *state;
            s.expire_probes(cfg, now_ns);
            if s.probes_issued < cfg.half_open_max_calls.max(1) {
                (State::HalfOpen, 0)
            } else {
                let wait = ms_until(now_ns, s.probes_expire_at(cfg)).min(HALF_OPEN_RETRY_MS);
                (State::HalfOpen, wait)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::*;
    use super::*;
    use crate::store::MemStore;

    #[test]
    fn default_config_is_valid() {
        assert_eq!(cfg().validate(), Ok(()));
        assert_eq!(FailurePolicy::default().validate(), Ok(()));
    }

    #[test]
    fn validation_names_the_bad_field() {
        type Tweak = fn(&mut BreakerConfig);
        let cases: [(Tweak, &str); 12] = [
            (|c| c.failure_threshold = 0, "failure_threshold"),
            (|c| c.window_ms = 5, "window_ms"),
            (|c| c.failure_rate_percent = Some(0), "failure_rate_percent"),
            (
                |c| c.failure_rate_percent = Some(101),
                "failure_rate_percent",
            ),
            (|c| c.min_requests = 0, "min_requests"),
            (|c| c.recovery_ms = 0, "recovery_ms"),
            (|c| c.max_recovery_ms = 10, "max_recovery_ms"),
            (|c| c.backoff_multiplier = 0.5, "backoff_multiplier"),
            (|c| c.backoff_multiplier = f64::NAN, "backoff_multiplier"),
            (
                |c| c.half_open_max_calls = 0,
                "half_open_max_calls must be >= 1",
            ),
            (
                |c| c.half_open_successes_to_close = 4,
                "half_open_successes_to_close",
            ),
            (|c| c.probe_timeout_ms = 0, "probe_timeout_ms"),
        ];
        for (tweak, field) in cases {
            let mut c = cfg();
            tweak(&mut c);
            let err = c.validate().unwrap_err();
            assert!(err.starts_with(field), "{err:?} should name {field}");
        }
        let p = FailurePolicy {
            failure_statuses: vec![(500, 599), (404, 404)],
            ..FailurePolicy::default()
        };
        assert!(p.validate().unwrap_err().starts_with("failure_statuses[1]"));
    }

    #[test]
    fn stays_closed_below_threshold() {
        let c = cfg();
        let mut s = BreakerState::default();
        for i in 0..4 {
            assert_eq!(rec(&mut s, &c, fail(), false, T0 + i * S), None);
        }
        assert_eq!(s.state(), State::Closed);
        assert_eq!(s.window_counts(&c, T0 + 4 * S), (0, 4));
        assert_eq!(adm(&mut s, &c, T0 + 5 * S).0, Admission::Allowed);
    }

    #[test]
    fn opens_at_threshold_within_window() {
        let c = cfg();
        let mut s = BreakerState::default();
        for i in 0..4 {
            rec(&mut s, &c, fail(), false, T0 + i * 10 * S);
        }
        let t = rec(&mut s, &c, fail(), false, T0 + 50 * S);
        assert_eq!(
            t,
            Some(Transition {
                from: State::Closed,
                to: State::Open,
                reason: "failure_threshold"
            })
        );
        assert_eq!(s.state(), State::Open);
        assert_eq!(s.opens(), 1);
    }

    #[test]
    fn rate_based_opening_respects_min_requests() {
        let c = BreakerConfig {
            failure_threshold: 100,
            failure_rate_percent: Some(50),
            min_requests: 10,
            ..cfg()
        };
        let mut s = BreakerState::default();
        // 4 failures out of 4: 100 %, but below min_requests.
        for _ in 0..4 {
            assert_eq!(rec(&mut s, &c, fail(), false, T0), None);
        }
        // 5 successes: 9 requests, still below min_requests.
        for _ in 0..5 {
            assert_eq!(rec(&mut s, &c, Outcome::Success, false, T0), None);
        }
        assert_eq!(s.state(), State::Closed);
        // 10th request, a failure: 5/10 = 50 % >= 50 %.
        let t = rec(&mut s, &c, fail(), false, T0);
        assert_eq!(t.map(|t| t.reason), Some("failure_rate"));
        assert_eq!(s.state(), State::Open);
    }

    #[test]
    fn rate_below_threshold_keeps_it_closed() {
        let c = BreakerConfig {
            failure_threshold: 100,
            failure_rate_percent: Some(50),
            min_requests: 10,
            ..cfg()
        };
        let mut s = BreakerState::default();
        for _ in 0..8 {
            rec(&mut s, &c, Outcome::Success, false, T0);
        }
        for _ in 0..7 {
            assert_eq!(rec(&mut s, &c, fail(), false, T0), None);
        }
        // 7 / 15 = 46 %.
        assert_eq!(s.state(), State::Closed);
    }

    #[test]
    fn open_rejects_with_correct_reset_in() {
        let c = cfg();
        let mut s = opened(&c);
        assert_eq!(
            adm(&mut s, &c, T0 + 10 * S),
            (
                Admission::Rejected {
                    reset_in_ms: 20_000
                },
                None
            )
        );
        // Rounded up to whole ms.
        assert_eq!(
            adm(&mut s, &c, T0 + 30 * S - 1).0,
            Admission::Rejected { reset_in_ms: 1 }
        );
        assert_eq!(peek_state(&s, &c, T0 + 10 * S), (State::Open, 20_000));
    }

    #[test]
    fn half_open_after_recovery() {
        let c = cfg();
        let mut s = opened(&c);
        assert_eq!(peek_state(&s, &c, T0 + 30 * S), (State::HalfOpen, 0));
        let (a, t) = adm(&mut s, &c, T0 + 30 * S);
        assert_eq!(a, Admission::Probe);
        assert_eq!(
            t,
            Some(Transition {
                from: State::Open,
                to: State::HalfOpen,
                reason: "recovery_elapsed"
            })
        );
        assert_eq!(s.state(), State::HalfOpen);
    }

    #[test]
    fn a_released_probe_permit_can_be_taken_again_at_once() {
        let c = cfg();
        let at = T0 + 30 * S;
        let mut s = half_open_at(&c, at);
        while adm(&mut s, &c, at).0 == Admission::Probe {}
        assert!(matches!(adm(&mut s, &c, at).0, Admission::Rejected { .. }));
        s = release_probe(&s).unwrap();
        assert_eq!(adm(&mut s, &c, at).0, Admission::Probe);
        // Never below the probes already answered; nothing outside HALF_OPEN.
        let mut done = half_open_at(&c, at);
        rec(&mut done, &c, Outcome::Success, true, at);
        if done.state() == State::HalfOpen {
            assert!(release_probe(&done).is_none());
        }
        assert!(release_probe(&BreakerState::default()).is_none());
        assert!(release_probe(&opened(&c)).is_none());
        // Shared: a missing key is not created.
        let store = MemStore::new();
        release_probe_shared(&store, "tg:cb:model=x", 8).unwrap();
        assert!(store.is_empty());
    }

    #[test]
    fn exactly_n_probes_are_admitted_then_rejected() {
        let c = cfg();
        let at = T0 + 30 * S;
        let mut s = half_open_at(&c, at);
        assert_eq!(adm(&mut s, &c, at + S), (Admission::Probe, None));
        assert_eq!(adm(&mut s, &c, at + 2 * S), (Admission::Probe, None));
        // Permits expire 60 s after the latest one (at + 2 s), but the probes usually answer long
        // before: clients are told to retry within HALF_OPEN_RETRY_MS.
        assert_eq!(
            adm(&mut s, &c, at + 3 * S).0,
            Admission::Rejected { reset_in_ms: 1_000 }
        );
        assert_eq!(peek_state(&s, &c, at + 3 * S), (State::HalfOpen, 1_000));
        assert_eq!(
            adm(&mut s, &c, at + 2 * S + 59_600 * NS_PER_MS).0,
            Admission::Rejected { reset_in_ms: 400 }
        );
        assert_eq!(s.probes_issued, 3);
    }

    #[test]
    fn probe_success_closes() {
        let c = cfg();
        let at = T0 + 30 * S;
        let mut s = half_open_at(&c, at);
        let t = rec(&mut s, &c, Outcome::Success, true, at + S);
        assert_eq!(
            t,
            Some(Transition {
                from: State::HalfOpen,
                to: State::Closed,
                reason: "probes_succeeded"
            })
        );
        assert_eq!(s.state(), State::Closed);
        assert_eq!(s.window_counts(&c, at + S), (0, 0));
        assert_eq!(adm(&mut s, &c, at + S).0, Admission::Allowed);
    }

    #[test]
    fn several_successes_to_close_are_counted_across_probes() {
        let c = BreakerConfig {
            half_open_successes_to_close: 2,
            ..cfg()
        };
        let at = T0 + 30 * S;
        let mut s = half_open_at(&c, at);
        adm(&mut s, &c, at);
        assert_eq!(rec(&mut s, &c, Outcome::Success, true, at + S), None);
        assert_eq!(s.state(), State::HalfOpen);
        assert!(rec(&mut s, &c, Outcome::Success, true, at + S).is_some());
        assert_eq!(s.state(), State::Closed);
    }

    #[test]
    fn non_probe_outcomes_in_half_open_are_ignored() {
        let c = cfg();
        let at = T0 + 30 * S;
        let s = half_open_at(&c, at);
        assert_eq!(record(&s, &c, Outcome::Success, false, at), (None, None));
        assert_eq!(record(&s, &c, fail(), false, at), (None, None));
    }

    #[test]
    fn probe_failure_reopens_with_doubled_recovery_capped_at_max() {
        let c = BreakerConfig {
            max_recovery_ms: 100_000,
            ..cfg()
        };
        let mut s = opened(&c);
        let mut now = T0;
        // Expected recovery of the 2nd, 3rd, 4th, 5th open: 60 s, 100 s (cap), 100 s, 100 s.
        for expect_ms in [60_000u64, 100_000, 100_000, 100_000] {
            let (state_now, reset) = peek_state(&s, &c, now);
            assert_eq!(state_now, State::Open);
            now += reset * 1_000_000;
            assert_eq!(adm(&mut s, &c, now).0, Admission::Probe);
            let t = rec(&mut s, &c, fail(), true, now);
            assert_eq!(
                t.map(|t| (t.to, t.reason)),
                Some((State::Open, "probe_failed"))
            );
            assert_eq!(
                adm(&mut s, &c, now).0,
                Admission::Rejected {
                    reset_in_ms: expect_ms
                }
            );
        }
        assert_eq!(s.opens(), 5);
    }

    #[test]
    fn close_resets_backoff() {
        let c = cfg();
        let mut s = opened(&c);
        let mut now = T0 + 30 * S;
        adm(&mut s, &c, now);
        rec(&mut s, &c, fail(), true, now); // re-open: 60 s
        now += 60 * S;
        adm(&mut s, &c, now);
        rec(&mut s, &c, Outcome::Success, true, now);
        assert_eq!(s.state(), State::Closed);
        assert_eq!(s.opens(), 0);
        for _ in 0..5 {
            rec(&mut s, &c, fail(), false, now);
        }
        assert_eq!(
            adm(&mut s, &c, now).0,
            Admission::Rejected {
                reset_in_ms: 30_000
            }
        );
    }

    #[test]
    fn retry_after_429_keeps_it_open_longer_than_recovery() {
        let c = cfg();
        let mut s = BreakerState::default();
        for _ in 0..4 {
            rec(&mut s, &c, fail(), false, T0);
        }
        rec(&mut s, &c, fail_ra(120_000), false, T0);
        assert_eq!(s.state(), State::Open);
        assert_eq!(
            adm(&mut s, &c, T0 + 31 * S).0,
            Admission::Rejected {
                reset_in_ms: 89_000
            }
        );
        assert_eq!(adm(&mut s, &c, T0 + 120 * S).0, Admission::Probe);
    }

    #[test]
    fn an_earlier_retry_after_is_honoured_when_the_breaker_trips_later() {
        let c = cfg();
        let mut s = BreakerState::default();
        rec(&mut s, &c, fail_ra(90_000), false, T0);
        for _ in 0..4 {
            rec(&mut s, &c, fail(), false, T0 + 10 * S);
        }
        assert_eq!(
            adm(&mut s, &c, T0 + 10 * S).0,
            Admission::Rejected {
                reset_in_ms: 80_000
            }
        );
    }

    #[test]
    fn retry_after_is_capped_at_max_recovery() {
        let c = cfg();
        let mut s = opened(&c);
        rec(&mut s, &c, fail_ra(u64::MAX), false, T0);
        assert_eq!(peek_state(&s, &c, T0), (State::Open, 300_000));
    }

    #[test]
    fn late_retry_after_while_open_only_extends() {
        let c = cfg();
        let s = opened(&c);
        assert_eq!(record(&s, &c, fail_ra(5_000), false, T0), (None, None));
        assert_eq!(record(&s, &c, fail(), false, T0), (None, None));
        let (next, t) = record(&s, &c, fail_ra(45_000), false, T0);
        assert_eq!(t, None);
        assert_eq!(peek_state(&next.unwrap(), &c, T0), (State::Open, 45_000));
    }

    #[test]
    fn probe_failure_with_retry_after_uses_the_longer_wait() {
        let c = cfg();
        let at = T0 + 30 * S;
        let mut s = half_open_at(&c, at);
        rec(&mut s, &c, fail_ra(200_000), true, at);
        assert_eq!(peek_state(&s, &c, at), (State::Open, 200_000));
    }

    #[test]
    fn expired_probe_permits_are_reissued() {
        let c = cfg();
        let at = T0 + 30 * S;
        let mut s = half_open_at(&c, at);
        adm(&mut s, &c, at);
        adm(&mut s, &c, at);
        assert!(matches!(
            adm(&mut s, &c, at + 59 * S).0,
            Admission::Rejected { .. }
        ));
        // No outcome ever arrived; 60 s after the last permit, three new probes may go.
        for _ in 0..3 {
            assert_eq!(adm(&mut s, &c, at + 60 * S).0, Admission::Probe);
        }
        assert!(matches!(
            adm(&mut s, &c, at + 60 * S).0,
            Admission::Rejected { .. }
        ));
        // A late success from the first round still closes.
        assert!(rec(&mut s, &c, Outcome::Success, true, at + 61 * S).is_some());
        assert_eq!(s.state(), State::Closed);
    }

    #[test]
    fn state_names_and_gauge_values() {
        assert_eq!(
            [State::Closed, State::Open, State::HalfOpen].map(|s| (s.as_str(), s.as_gauge())),
            [("closed", 0), ("open", 1), ("half_open", 2)]
        );
    }

    #[test]
    fn successes_reported_together_count_as_the_same_number_reported_one_by_one() {
        let c = BreakerConfig {
            failure_rate_percent: Some(50),
            ..cfg()
        };
        let mut one_by_one = BreakerState::default();
        rec(&mut one_by_one, &c, fail(), false, T0);
        let together = one_by_one;
        for _ in 0..7 {
            rec(&mut one_by_one, &c, Outcome::Success, false, T0 + S);
        }
        let together = record_successes(&together, &c, 7, T0 + S).unwrap();
        assert_eq!(together, one_by_one);
        assert_eq!(together.window_counts(&c, T0 + S), (7, 1));
        // Nothing to count: none reported, no rate rule, or not CLOSED.
        assert_eq!(record_successes(&together, &c, 0, T0), None);
        assert_eq!(record_successes(&together, &cfg(), 7, T0), None);
        let open = BreakerState {
            state: State::Open,
            ..together
        };
        assert_eq!(record_successes(&open, &c, 7, T0), None);
    }

    #[test]
    fn unvalidated_zero_config_does_not_panic() {
        let c = BreakerConfig {
            failure_threshold: 0,
            window_ms: 0,
            min_requests: 0,
            recovery_ms: 0,
            max_recovery_ms: 0,
            backoff_multiplier: f64::NAN,
            half_open_max_calls: 0,
            half_open_successes_to_close: 0,
            probe_timeout_ms: 0,
            failure_rate_percent: Some(0),
        };
        let mut s = BreakerState::default();
        rec(&mut s, &c, fail(), false, 0);
        adm(&mut s, &c, u64::MAX);
        rec(&mut s, &c, Outcome::Success, true, u64::MAX);
        peek_state(&s, &c, u64::MAX);
    }
}
