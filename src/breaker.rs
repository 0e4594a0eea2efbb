//! Circuit breaker per upstream key (model, cluster, provider…): a pure state machine whose state lives
//! in Envoy shared data, so every worker sees the same breaker.
//!
//! Nothing here reads a clock or talks to Envoy: time comes in as `now_ns` (nanoseconds since the epoch)
//! and shared data is reached through [`SharedStore`]. The host adapter calls [`admit_shared`] before it
//! sends a request to a key, [`classify`] + [`retry_after_ms`] on the response, then [`record_shared`].
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

use crate::store::{self, read_u32, read_u64, Codec, SharedStore, UpdateError, UpdateStats};

/// Number of sub-windows in the sliding failure window.
pub const BUCKETS: usize = 12;
/// Version byte of the encoding.
pub const VERSION: u8 = 1;
/// Length of the encoded [`BreakerState`].
pub const ENCODED_LEN: usize = HEADER_LEN + BUCKETS * BUCKET_LEN;
/// Longest breaker name kept in a key, in bytes.
pub const MAX_NAME_BYTES: usize = 128;
/// Longest scope kept in a key, in bytes.
pub const MAX_SCOPE_BYTES: usize = 32;

const HEADER_LEN: usize = 46;
const BUCKET_LEN: usize = 16;
const NS_PER_MS: u64 = 1_000_000;

const OFF_STATE: usize = 1;
const OFF_OPENS: usize = 2;
const OFF_PROBES_ISSUED: usize = 6;
const OFF_PROBE_SUCCESSES: usize = 10;
const OFF_OPEN_UNTIL: usize = 14;
const OFF_RETRY_UNTIL: usize = 22;
const OFF_LAST_PROBE: usize = 30;
const OFF_BUCKET_NS: usize = 38;

/// Breaker tuning, already validated (see [`BreakerConfig::validate`]).
#[derive(Debug, Clone, PartialEq)]
pub struct BreakerConfig {
    /// Failures within the window that open the breaker (default 5).
    pub failure_threshold: u32,
    /// Length of the sliding window in ms (default 60 000; 12 ..= 86 400 000).
    pub window_ms: u64,
    /// Also open when failures / requests in the window reach this percentage (default off).
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

    /// Width of one sub-window in ns (never 0, even for an unvalidated config).
    fn bucket_ns(&self) -> u64 {
        (self.window_ms.saturating_mul(NS_PER_MS) / BUCKETS as u64).max(1)
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

    fn to_byte(self) -> u8 {
        self.as_gauge() as u8
    }

    fn from_byte(b: u8) -> Option<Self> {
        match b {
            0 => Some(State::Closed),
            1 => Some(State::Open),
            2 => Some(State::HalfOpen),
            _ => None,
        }
    }
}

/// One sub-window of the sliding window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Bucket {
    /// `now_ns / bucket_ns` of the sub-window these counts belong to.
    epoch: u64,
    successes: u32,
    failures: u32,
}

/// The shared record of one breaker. `Default` is a fresh CLOSED breaker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BreakerState {
    state: State,
    opens: u32,
    probes_issued: u32,
    probe_successes: u32,
    open_until_ns: u64,
    retry_until_ns: u64,
    last_probe_ns: u64,
    bucket_ns: u64,
    buckets: [Bucket; BUCKETS],
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
        let bucket_ns = cfg.bucket_ns();
        if self.bucket_ns != bucket_ns {
            return (0, 0);
        }
        let cur = now_ns / bucket_ns;
        self.buckets
            .iter()
            // In the window: one of the last BUCKETS epochs (or one ahead, for a worker whose clock
            // read came a little later).
            .filter(|b| {
                b.epoch.saturating_add(BUCKETS as u64) > cur && b.epoch <= cur.saturating_add(1)
            })
            .fold((0, 0), |(s, f), b| {
                (s + u64::from(b.successes), f + u64::from(b.failures))
            })
    }

    /// Adds one outcome to the sub-window of `now_ns`, resetting it first if it held an older epoch.
    fn count(&mut self, cfg: &BreakerConfig, now_ns: u64, success: bool) {
        let bucket_ns = cfg.bucket_ns();
        if self.bucket_ns != bucket_ns {
            // The window was counted with another width (config changed): its epochs mean nothing now.
            self.buckets = [Bucket::default(); BUCKETS];
            self.bucket_ns = bucket_ns;
        }
        let cur = now_ns / bucket_ns;
        let slot = usize::try_from(cur % BUCKETS as u64).unwrap_or(0);
        if let Some(b) = self.buckets.get_mut(slot) {
            if b.epoch != cur {
                *b = Bucket {
                    epoch: cur,
                    ..Bucket::default()
                };
            }
            if success {
                b.successes = b.successes.saturating_add(1);
            } else {
                b.failures = b.failures.saturating_add(1);
            }
        }
    }

    /// Why the window says "open", if it does.
    fn trip_reason(&self, cfg: &BreakerConfig, now_ns: u64) -> Option<&'static str> {
        let (successes, failures) = self.window_counts(cfg, now_ns);
        if failures >= u64::from(cfg.failure_threshold.max(1)) {
            return Some(REASON_THRESHOLD);
        }
        let pct = u64::from(cfg.failure_rate_percent?);
        let total = successes + failures;
        (total >= u64::from(cfg.min_requests.max(1)) && failures * 100 >= pct * total)
            .then_some(REASON_RATE)
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
            bucket_ns: self.bucket_ns,
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

impl Codec for BreakerState {
    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(ENCODED_LEN);
        v.push(VERSION);
        v.push(self.state.to_byte());
        v.extend_from_slice(&self.opens.to_le_bytes());
        v.extend_from_slice(&self.probes_issued.to_le_bytes());
        v.extend_from_slice(&self.probe_successes.to_le_bytes());
        v.extend_from_slice(&self.open_until_ns.to_le_bytes());
        v.extend_from_slice(&self.retry_until_ns.to_le_bytes());
        v.extend_from_slice(&self.last_probe_ns.to_le_bytes());
        v.extend_from_slice(&self.bucket_ns.to_le_bytes());
        for b in &self.buckets {
            v.extend_from_slice(&b.epoch.to_le_bytes());
            v.extend_from_slice(&b.successes.to_le_bytes());
            v.extend_from_slice(&b.failures.to_le_bytes());
        }
        v
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != ENCODED_LEN || bytes.first() != Some(&VERSION) {
            return None;
        }
        let mut buckets = [Bucket::default(); BUCKETS];
        for (i, b) in buckets.iter_mut().enumerate() {
            let at = HEADER_LEN + i * BUCKET_LEN;
            *b = Bucket {
                epoch: read_u64(bytes, at)?,
                successes: read_u32(bytes, at + 8)?,
                failures: read_u32(bytes, at + 12)?,
            };
        }
        Some(Self {
            state: State::from_byte(*bytes.get(OFF_STATE)?)?,
            opens: read_u32(bytes, OFF_OPENS)?,
            probes_issued: read_u32(bytes, OFF_PROBES_ISSUED)?,
            probe_successes: read_u32(bytes, OFF_PROBE_SUCCESSES)?,
            open_until_ns: read_u64(bytes, OFF_OPEN_UNTIL)?,
            retry_until_ns: read_u64(bytes, OFF_RETRY_UNTIL)?,
            last_probe_ns: read_u64(bytes, OFF_LAST_PROBE)?,
            bucket_ns: read_u64(bytes, OFF_BUCKET_NS)?,
            buckets,
        })
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

const REASON_THRESHOLD: &str = "failure_threshold";
const REASON_RATE: &str = "failure_rate";
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
            next.count(cfg, now_ns, true);
            (Some(next), None)
        }
        (State::Closed, Outcome::Failure { .. }) => {
            next.count(cfg, now_ns, false);
            if let Some(d) = retry_deadline {
                next.retry_until_ns = next.retry_until_ns.max(d);
            }
            let Some(reason) = next.trip_reason(cfg, now_ns) else {
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

/// [`release_probe`] as one bounded CAS read-modify-write of `key` (nothing is created).
pub fn release_probe_shared(
    store: &dyn SharedStore,
    key: &str,
    max_retries: u32,
) -> Result<(), UpdateError> {
    if !matches!(store.get(key), Ok(Some(_))) {
        return Ok(());
    }
    store::update(store, key, max_retries, &BreakerState::default(), |s| {
        ((), release_probe(s))
    })
    .map(|_| ())
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

/// A corrupt value was replaced by a fresh state in memory; make sure the key holds valid bytes so the
/// corruption is reported once, not on every request. A failure here is harmless: the next call retries.
fn repair_if_corrupt(store: &dyn SharedStore, key: &str, stats: &UpdateStats, max_retries: u32) {
    if stats.corrupt {
        let _ = store::update(store, key, max_retries, &BreakerState::default(), |s| {
            ((), Some(*s))
        });
    }
}

/// [`admit`] as one bounded CAS read-modify-write of `key` (created CLOSED when missing).
pub fn admit_shared(
    store: &dyn SharedStore,
    key: &str,
    cfg: &BreakerConfig,
    now_ns: u64,
    max_retries: u32,
) -> Result<(Admission, Option<Transition>, UpdateStats), UpdateError> {
    let ((admission, transition), stats) =
        store::update(store, key, max_retries, &BreakerState::default(), |s| {
            let (a, next, t) = admit(s, cfg, now_ns);
            ((a, t), next)
        })?;
    repair_if_corrupt(store, key, &stats, max_retries);
    Ok((admission, transition, stats))
}

/// Whether [`record`] leaves every state unchanged for this outcome: a success that was not a probe,
/// without a failure-rate threshold (CLOSED counts no successes then, OPEN ignores them, and only probes
/// count in HALF_OPEN).
pub fn record_is_noop(cfg: &BreakerConfig, outcome: Outcome, was_probe: bool) -> bool {
    matches!(outcome, Outcome::Success) && !was_probe && cfg.failure_rate_percent.is_none()
}

/// [`record`] as one bounded CAS read-modify-write of `key` (created CLOSED when missing); no host call
/// at all when [`record_is_noop`].
pub fn record_shared(
    store: &dyn SharedStore,
    key: &str,
    cfg: &BreakerConfig,
    outcome: Outcome,
    was_probe: bool,
    now_ns: u64,
    max_retries: u32,
) -> Result<(Option<Transition>, UpdateStats), UpdateError> {
    if record_is_noop(cfg, outcome, was_probe) {
        return Ok((None, UpdateStats::default()));
    }
    let (transition, stats) =
        store::update(store, key, max_retries, &BreakerState::default(), |s| {
            let (next, t) = record(s, cfg, outcome, was_probe, now_ns);
            (t, next)
        })?;
    repair_if_corrupt(store, key, &stats, max_retries);
    Ok((transition, stats))
}

/// Shared-data key of a breaker: `tg:cb:<scope>=<name>`. Bytes other than ASCII letters, digits and
/// `-._:/@+` become `_`; the scope is cut to [`MAX_SCOPE_BYTES`] and the name to [`MAX_NAME_BYTES`]
/// (two names equal in their first 128 characters share a breaker).
pub fn key(scope: &str, name: &str) -> String {
    let mut k = String::with_capacity(6 + MAX_SCOPE_BYTES + 1 + MAX_NAME_BYTES);
    k.push_str(crate::keys::BREAKER);
    push_sanitized(&mut k, scope, MAX_SCOPE_BYTES);
    k.push('=');
    push_sanitized(&mut k, name, MAX_NAME_BYTES);
    k
}

fn push_sanitized(out: &mut String, s: &str, max: usize) {
    for c in s.chars().take(max) {
        let keep =
            c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | ':' | '/' | '@' | '+');
        out.push(if keep { c } else { '_' });
    }
}

/// Which HTTP results count as failures (see [`classify`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailurePolicy {
    /// Inclusive status ranges that are failures, each within 500..=599 (default `[(500, 599)]`).
    pub failure_statuses: Vec<(u32, u32)>,
    /// Whether an upstream 429 is a failure (default true).
    pub count_429: bool,
    /// Envoy response-code details or response flags that mean the upstream failed (connect failure,
    /// reset, timeout). An entry matches a comma-separated token equal to it or equal to it followed by
    /// `{…}` (e.g. `upstream_reset_before_response_started{connection_failure}`).
    pub failure_reasons: Vec<String>,
}

impl Default for FailurePolicy {
    fn default() -> Self {
        Self {
            failure_statuses: vec![(500, 599)],
            count_429: true,
            failure_reasons: [
                // Response code details.
                "upstream_reset_before_response_started",
                "upstream_reset_after_response_started",
                "upstream_response_timeout",
                // Envoy 1.40 labels a route timeout's local reply `response_timeout`.
                "response_timeout",
                "upstream_per_try_timeout",
                "upstream_per_try_idle_timeout",
                "upstream_max_stream_duration_reached",
                "no_healthy_upstream",
                // Response flags.
                "UF",
                "UH",
                "UT",
                "UC",
                "UR",
                "URX",
                "UPE",
                "UMSDR",
            ]
            .iter()
            .map(|s| (*s).to_string())
            .collect(),
        }
    }
}

impl FailurePolicy {
    /// Checks meaning; the error names the offending field.
    pub fn validate(&self) -> Result<(), String> {
        for (i, (lo, hi)) in self.failure_statuses.iter().enumerate() {
            if !(500..=599).contains(lo) || !(500..=599).contains(hi) || lo > hi {
                return Err(format!(
                    "failure_statuses[{i}] must be a range lo..=hi within 500..=599"
                ));
            }
        }
        for (i, r) in self.failure_reasons.iter().enumerate() {
            if r.trim().is_empty() {
                return Err(format!("failure_reasons[{i}] must not be empty"));
            }
        }
        Ok(())
    }

    fn is_failure_status(&self, status: u32) -> bool {
        self.failure_statuses
            .iter()
            .any(|(lo, hi)| (*lo..=*hi).contains(&status))
    }

    fn is_failure_reason(&self, reason: &str) -> bool {
        reason.split(',').map(str::trim).any(|token| {
            self.failure_reasons.iter().any(|e| {
                token
                    .strip_prefix(e.as_str())
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with('{'))
            })
        })
    }
}

/// Classifies one finished upstream request; `None` means "counts neither way".
///
/// * `local_reason`: Envoy's response code details or response flags, as the host has them. `None`, `""`,
///   `"-"` and `"via_upstream"` mean the upstream answered and the status decides. A reason in
///   `policy.failure_reasons` (connect failure, reset, timeout) is a failure whatever the status; any
///   other reason is a reply made by Envoy or a filter (tokengate's own 429, a fault filter…), which says
///   nothing about the upstream: `None`.
/// * Status: 429 is a failure if `count_429`; other 4xx never count; statuses in `failure_statuses`
///   fail; 2xx/3xx succeed unless `stream_completed == Some(false)` (the upstream's stream ended without
///   its final event). Pass `None` for `stream_completed` when not streaming or when the *client* went
///   away: that is not the upstream's fault.
///
/// A failure comes back without Retry-After; attach it with [`Outcome::with_retry_after`].
pub fn classify(
    status: u32,
    local_reason: Option<&str>,
    stream_completed: Option<bool>,
    policy: &FailurePolicy,
) -> Option<Outcome> {
    let failure = Outcome::Failure {
        retry_after_ms: None,
    };
    if let Some(r) = local_reason
        .map(str::trim)
        .filter(|r| !r.is_empty() && *r != "-" && *r != "via_upstream")
    {
        return policy.is_failure_reason(r).then_some(failure);
    }
    match status {
        429 => policy.count_429.then_some(failure),
        400..=499 => None,
        s if policy.is_failure_status(s) => Some(failure),
        200..=399 if stream_completed == Some(false) => Some(failure),
        200..=399 => Some(Outcome::Success),
        _ => None,
    }
}

/// Whether a 2xx/3xx response ended because the upstream connection was reset or closed after the
/// response had started (Envoy's `upstream_reset_after_response_started{…}` details): a cut stream.
pub fn cut_after_response_started(status: u32, local_reason: Option<&str>) -> bool {
    (200..400).contains(&status)
        && local_reason.is_some_and(|r| {
            r.trim()
                .starts_with("upstream_reset_after_response_started")
        })
}

/// How long the upstream asked us to wait, in ms: the largest of `Retry-After` (delta seconds; an
/// HTTP-date or anything else is ignored) and the reset headers (`x-ratelimit-reset-requests` /
/// `-tokens` style durations such as `1s`, `6m0s`, `20ms`, `0.5s`, `1h2m`, or bare decimal seconds
/// `0.25`), rounded up to whole ms. `None` when nothing parses. The caller caps it at `max_recovery_ms`.
pub fn retry_after_ms(retry_after: Option<&str>, reset_headers: &[&str]) -> Option<u64> {
    let from_retry_after = retry_after.and_then(parse_delta_seconds);
    reset_headers
        .iter()
        .filter_map(|h| parse_duration_ms(h))
        .chain(from_retry_after)
        .max()
}

/// `Retry-After` delta-seconds: ASCII digits only.
fn parse_delta_seconds(v: &str) -> Option<u64> {
    let v = v.trim();
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // All digits: a parse error can only be overflow.
    let secs = v.parse::<u64>().unwrap_or(u64::MAX);
    Some(secs.saturating_mul(1000))
}

/// A Go-style duration (`1h2m3.5s`, `20ms`, `100us`) or bare decimal seconds, in ms rounded up.
fn parse_duration_ms(v: &str) -> Option<u64> {
    let v = v.trim();
    if v.is_empty() {
        return None;
    }
    let mut rest = v;
    let mut total_ms = 0.0f64;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, tail) = rest.split_at(num_len);
        if !num.bytes().any(|b| b.is_ascii_digit()) {
            return None;
        }
        let n: f64 = num.parse().ok()?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let scale = match unit {
            // Bare number: seconds, and only as the whole value.
            "" if num_len == v.len() => 1000.0,
            "h" => 3_600_000.0,
            "m" => 60_000.0,
            "s" => 1000.0,
            "ms" => 1.0,
            "us" | "µs" => 0.001,
            "ns" => 0.000_001,
            _ => return None,
        };
        total_ms += n * scale;
        rest = tail;
    }
    if !total_ms.is_finite() || total_ms < 0.0 {
        return None;
    }
    // `as` saturates at u64::MAX for huge values.
    Some(total_ms.ceil() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;
    use std::cell::{Cell, RefCell};

    const S: u64 = 1_000_000_000;
    const T0: u64 = 1_700_000_000 * S;

    fn cfg() -> BreakerConfig {
        BreakerConfig::default()
    }

    fn fail() -> Outcome {
        Outcome::Failure {
            retry_after_ms: None,
        }
    }

    fn fail_ra(ms: u64) -> Outcome {
        Outcome::Failure {
            retry_after_ms: Some(ms),
        }
    }

    /// Applies `record` and keeps the state (unchanged when nothing is written).
    fn rec(
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

    fn adm(s: &mut BreakerState, c: &BreakerConfig, now: u64) -> (Admission, Option<Transition>) {
        let (a, next, t) = admit(s, c, now);
        if let Some(n) = next {
            *s = n;
        }
        (a, t)
    }

    /// A CLOSED breaker opened by `failure_threshold` failures at `T0`.
    fn opened(c: &BreakerConfig) -> BreakerState {
        let mut s = BreakerState::default();
        for _ in 0..c.failure_threshold {
            rec(&mut s, c, fail(), false, T0);
        }
        assert_eq!(s.state(), State::Open);
        s
    }

    /// An OPEN breaker moved to HALF_OPEN at `at` by one probe admission.
    fn half_open_at(c: &BreakerConfig, at: u64) -> BreakerState {
        let mut s = opened(c);
        let (a, t) = adm(&mut s, c, at);
        assert_eq!(a, Admission::Probe);
        assert_eq!(t.map(|t| t.to), Some(State::HalfOpen));
        s
    }

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
    fn old_failures_slide_out_of_the_window() {
        let c = cfg();
        let mut s = BreakerState::default();
        for _ in 0..4 {
            rec(&mut s, &c, fail(), false, T0);
        }
        // 61 s later the four failures are outside the 60 s window.
        assert_eq!(rec(&mut s, &c, fail(), false, T0 + 61 * S), None);
        assert_eq!(s.state(), State::Closed);
        assert_eq!(s.window_counts(&c, T0 + 61 * S), (0, 1));
        // Four more close together do open it.
        for _ in 0..3 {
            assert_eq!(rec(&mut s, &c, fail(), false, T0 + 62 * S), None);
        }
        assert!(rec(&mut s, &c, fail(), false, T0 + 62 * S).is_some());
    }

    #[test]
    fn a_slot_reused_after_a_full_turn_forgets_its_old_counts() {
        let c = cfg();
        let mut s = BreakerState::default();
        rec(&mut s, &c, fail(), false, T0);
        rec(&mut s, &c, fail(), false, T0);
        // Exactly one window later: the same slot, a new epoch.
        rec(&mut s, &c, fail(), false, T0 + 60 * S);
        assert_eq!(s.window_counts(&c, T0 + 60 * S), (0, 1));
    }

    #[test]
    fn successes_are_not_written_without_a_rate_rule() {
        let c = cfg();
        let s = BreakerState::default();
        assert_eq!(record(&s, &c, Outcome::Success, false, T0), (None, None));
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
    fn a_plain_success_is_recorded_without_touching_shared_data_when_it_changes_nothing() {
        let c = cfg();
        assert!(c.failure_rate_percent.is_none());
        let t = T0;
        // record() agrees: no state changes on a non-probe success, whatever the state.
        for s in [
            BreakerState::default(),
            opened(&c),
            half_open_at(&c, t + 30 * S),
        ] {
            assert_eq!(
                record(&s, &c, Outcome::Success, false, t + 31 * S),
                (None, None)
            );
        }
        let store = MemStore::new();
        record_shared(&store, "tg:cb:model=x", &c, Outcome::Success, false, t, 8).unwrap();
        assert_eq!(store.reads(), 0);
        assert!(store.is_empty());
        // A probe's success, a failure, or a failure-rate threshold still read and write.
        record_shared(&store, "tg:cb:model=x", &c, Outcome::Success, true, t, 8).unwrap();
        assert!(store.reads() > 0);
        let rate = BreakerConfig {
            failure_rate_percent: Some(50),
            ..cfg()
        };
        assert!(!record_is_noop(&rate, Outcome::Success, false));
        assert!(!record_is_noop(
            &c,
            Outcome::Failure {
                retry_after_ms: None
            },
            false
        ));
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
    fn encode_decode_round_trip() {
        let c = BreakerConfig {
            failure_rate_percent: Some(90),
            ..cfg()
        };
        let mut s = BreakerState::default();
        for i in 0..30 {
            rec(&mut s, &c, Outcome::Success, false, T0 + i * S);
        }
        rec(&mut s, &c, fail_ra(7_000), false, T0 + 30 * S);
        let s = {
            let mut s = s;
            s.opens = 3;
            s.probes_issued = 2;
            s.probe_successes = 1;
            s.last_probe_ns = 42;
            s.open_until_ns = u64::MAX;
            s
        };
        let bytes = s.encode();
        assert_eq!(bytes.len(), ENCODED_LEN);
        assert_eq!(bytes.len(), 238);
        assert_eq!(bytes[0], 1);
        assert_eq!(BreakerState::decode(&bytes), Some(s));
        for st in [State::Open, State::HalfOpen] {
            let x = BreakerState { state: st, ..s };
            assert_eq!(BreakerState::decode(&x.encode()), Some(x));
        }
    }

    #[test]
    fn corrupt_bytes_decode_to_none() {
        let good = BreakerState::default().encode();
        assert_eq!(BreakerState::decode(&[]), None);
        assert_eq!(BreakerState::decode(&good[..ENCODED_LEN - 1]), None);
        let mut longer = good.clone();
        longer.push(0);
        assert_eq!(BreakerState::decode(&longer), None);
        let mut bad_version = good.clone();
        bad_version[0] = 2;
        assert_eq!(BreakerState::decode(&bad_version), None);
        let mut bad_state = good.clone();
        bad_state[1] = 3;
        assert_eq!(BreakerState::decode(&bad_state), None);
    }

    #[test]
    fn corrupt_value_in_store_is_reported_once_and_repaired() {
        let store = MemStore::new();
        let k = key("model", "gpt-4.1");
        store.set(&k, b"junk", 0).unwrap();
        let (a, _, st) = admit_shared(&store, &k, &cfg(), T0, 8).unwrap();
        assert_eq!(a, Admission::Allowed);
        assert!(st.corrupt);
        let (_, _, st) = admit_shared(&store, &k, &cfg(), T0, 8).unwrap();
        assert!(!st.corrupt);
    }

    #[test]
    fn a_cut_stream_is_a_reset_after_a_successful_start() {
        let cut = Some("upstream_reset_after_response_started{connection_termination}");
        assert!(cut_after_response_started(200, cut));
        assert!(!cut_after_response_started(503, cut));
        assert!(!cut_after_response_started(
            200,
            Some("upstream_reset_before_response_started{connection_termination}")
        ));
        assert!(!cut_after_response_started(200, Some("via_upstream")));
        assert!(!cut_after_response_started(200, None));
    }

    #[test]
    fn classify_table() {
        let p = FailurePolicy::default();
        let f = Some(fail());
        let ok = Some(Outcome::Success);
        type Case<'a> = (u32, Option<&'a str>, Option<bool>, Option<Outcome>);
        let cases: Vec<Case> = vec![
            (500, None, None, f),
            (502, None, None, f),
            (503, Some("via_upstream"), None, f),
            (504, None, None, f),
            (429, None, None, f),
            (400, None, None, None),
            (401, None, None, None),
            (404, None, None, None),
            (200, None, Some(true), ok),
            (200, None, None, ok),
            (302, Some("-"), None, ok),
            (200, None, Some(false), f),
            (200, Some("via_upstream"), Some(false), f),
            (
                503,
                Some("upstream_reset_before_response_started{connection_failure}"),
                None,
                f,
            ),
            (
                503,
                Some("upstream_reset_before_response_started{remote_reset}"),
                None,
                f,
            ),
            (504, Some("upstream_response_timeout"), None, f),
            (503, Some("no_healthy_upstream"), None, f),
            (0, Some("UF,URX"), None, f),
            (504, Some("UT"), None, f),
            // Local replies not caused by the upstream count neither way.
            (429, Some("wasm_local_reply"), None, None),
            (503, Some("fault_filter_abort"), None, None),
            (200, Some("downstream_remote_disconnect"), Some(false), None),
            (0, Some("UFX"), None, None),
            (0, None, None, None),
        ];
        for (status, reason, done, want) in cases {
            assert_eq!(
                classify(status, reason, done, &p),
                want,
                "{status} {reason:?} {done:?}"
            );
        }
        let no429 = FailurePolicy {
            count_429: false,
            ..FailurePolicy::default()
        };
        assert_eq!(classify(429, None, None, &no429), None);
        let only_502_503 = FailurePolicy {
            failure_statuses: vec![(502, 503)],
            ..FailurePolicy::default()
        };
        assert_eq!(classify(500, None, None, &only_502_503), None);
        assert_eq!(classify(502, None, None, &only_502_503), f);
        assert_eq!(
            classify(504, Some("upstream_response_timeout"), None, &only_502_503),
            f
        );
    }

    #[test]
    fn retry_after_attaches_to_failures_only() {
        assert_eq!(fail().with_retry_after(Some(5)), fail_ra(5));
        assert_eq!(Outcome::Success.with_retry_after(Some(5)), Outcome::Success);
    }

    #[test]
    fn retry_after_ms_parsing() {
        assert_eq!(retry_after_ms(Some("7"), &[]), Some(7_000));
        assert_eq!(retry_after_ms(Some(" 7 "), &[]), Some(7_000));
        assert_eq!(retry_after_ms(Some("0"), &[]), Some(0));
        assert_eq!(retry_after_ms(Some("-1"), &[]), None);
        assert_eq!(retry_after_ms(Some("abc"), &[]), None);
        assert_eq!(retry_after_ms(Some("1.5"), &[]), None);
        assert_eq!(
            retry_after_ms(Some("Wed, 21 Oct 2015 07:28:00 GMT"), &[]),
            None
        );
        assert_eq!(
            retry_after_ms(Some("99999999999999999999999"), &[]),
            Some(u64::MAX)
        );
        assert_eq!(retry_after_ms(None, &["6m0s"]), Some(360_000));
        assert_eq!(retry_after_ms(None, &["1.5s"]), Some(1_500));
        assert_eq!(retry_after_ms(None, &["20ms"]), Some(20));
        assert_eq!(retry_after_ms(None, &["0.5s"]), Some(500));
        assert_eq!(retry_after_ms(None, &["1s"]), Some(1_000));
        assert_eq!(retry_after_ms(None, &["1h2m3s"]), Some(3_723_000));
        assert_eq!(retry_after_ms(None, &["100us"]), Some(1));
        assert_eq!(retry_after_ms(None, &["0.25"]), Some(250));
        for bad in [
            "",
            "s",
            "-1s",
            "1x",
            "1.2.3s",
            "inf",
            "1e3s",
            "2024-01-01T00:00:00Z",
            "5s3",
        ] {
            assert_eq!(retry_after_ms(None, &[bad]), None, "{bad:?}");
        }
        assert_eq!(
            retry_after_ms(Some("2"), &["20ms", "6m0s", "junk"]),
            Some(360_000)
        );
        assert_eq!(retry_after_ms(Some("120"), &["1s"]), Some(120_000));
        assert_eq!(retry_after_ms(None, &[]), None);
    }

    #[test]
    fn key_is_prefixed_sanitized_and_bounded() {
        assert_eq!(key("model", "gpt-4.1"), "tg:cb:model=gpt-4.1");
        assert_eq!(key("cluster", "a b=c\n\u{e9}"), "tg:cb:cluster=a_b_c__");
        let long = "x".repeat(500);
        let k = key("model", &long);
        assert_eq!(k.len(), "tg:cb:model=".len() + MAX_NAME_BYTES);
        let wide = "\u{1F600}".repeat(300);
        assert!(key("model", &wide).len() <= "tg:cb:model=".len() + MAX_NAME_BYTES);
    }

    #[test]
    fn state_names_and_gauge_values() {
        assert_eq!(
            [State::Closed, State::Open, State::HalfOpen].map(|s| (s.as_str(), s.as_gauge())),
            [("closed", 0), ("open", 1), ("half_open", 2)]
        );
    }

    #[test]
    fn window_counted_with_another_width_is_discarded() {
        let c = cfg();
        let mut s = BreakerState::default();
        for _ in 0..4 {
            rec(&mut s, &c, fail(), false, T0);
        }
        let c2 = BreakerConfig {
            window_ms: 120_000,
            ..cfg()
        };
        assert_eq!(s.window_counts(&c2, T0), (0, 0));
        assert_eq!(rec(&mut s, &c2, fail(), false, T0), None);
        assert_eq!(s.window_counts(&c2, T0), (0, 1));
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

    // ---- shared store: two workers ----

    /// Puts a breaker into HALF_OPEN with no permit taken yet: OPEN whose recovery ended at `T0 + 30 s`.
    fn store_with_breaker_ready_to_probe(store: &MemStore, k: &str, c: &BreakerConfig) {
        for _ in 0..c.failure_threshold {
            record_shared(store, k, c, fail(), false, T0, 8).unwrap();
        }
        let (s, corrupt) = store::peek::<BreakerState>(store, k).unwrap();
        assert!(!corrupt);
        assert_eq!(s.map(|s| s.state()), Some(State::Open));
    }

    #[test]
    fn two_workers_alternating_admit_exactly_three_probes() {
        let store = MemStore::new();
        let k = key("model", "gpt-4.1");
        let c = cfg();
        store_with_breaker_ready_to_probe(&store, &k, &c);
        let mut probes = 0;
        for i in 0..10u64 {
            // Worker A on even attempts, worker B on odd ones, each with its own clock read.
            let now = T0 + 30 * S + i * 1_000 + (i % 2) * 7;
            let (a, _, _) = admit_shared(&store, &k, &c, now, 8).unwrap();
            if a == Admission::Probe {
                probes += 1;
            }
        }
        assert_eq!(probes, 3);
    }

    type OtherWorker<'a> = Box<dyn FnMut(&MemStore) + 'a>;

    /// A store that lets "the other worker" run right after each of our reads, before our write.
    struct Racing<'a> {
        inner: &'a MemStore,
        other: RefCell<OtherWorker<'a>>,
        armed: Cell<u32>,
    }

    impl SharedStore for Racing<'_> {
        fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, store::StoreError> {
            let r = self.inner.get(key);
            if self.armed.get() > 0 {
                self.armed.set(self.armed.get() - 1);
                (self.other.borrow_mut())(self.inner);
            }
            r
        }
        fn set(&self, key: &str, value: &[u8], cas: u32) -> Result<(), store::StoreError> {
            self.inner.set(key, value, cas)
        }
    }

    #[test]
    fn two_workers_racing_inside_the_cas_admit_exactly_three_probes() {
        let store = MemStore::new();
        let k = key("model", "gpt-4.1");
        let c = cfg();
        store_with_breaker_ready_to_probe(&store, &k, &c);
        let now = T0 + 30 * S;
        let b_probes = Cell::new(0u32);
        let racing = Racing {
            inner: &store,
            other: RefCell::new(Box::new(|s: &MemStore| {
                // Worker B admits between worker A's read and write.
                let (a, _, _) = admit_shared(s, &k, &c, now, 8).unwrap();
                if a == Admission::Probe {
                    b_probes.set(b_probes.get() + 1);
                }
            })),
            armed: Cell::new(u32::MAX),
        };
        let mut a_probes = 0;
        let mut a_retries = 0;
        for _ in 0..5 {
            let (a, _, st) = admit_shared(&racing, &k, &c, now, 8).unwrap();
            a_retries += st.retries;
            if a == Admission::Probe {
                a_probes += 1;
            }
        }
        // 5 attempts by A, each read followed by one of B's: 10+ attempts in all, 3 probes in all.
        assert_eq!(a_probes + b_probes.get(), 3);
        assert!(b_probes.get() >= 1);
        assert!(a_retries >= 1, "A's stale writes must have been retried");
    }

    #[test]
    fn cas_conflict_mid_record_is_retried_and_both_failures_count() {
        let store = MemStore::new();
        let k = key("model", "gpt-4.1");
        let c = cfg();
        for _ in 0..3 {
            record_shared(&store, &k, &c, fail(), false, T0, 8).unwrap();
        }
        let racing = Racing {
            inner: &store,
            other: RefCell::new(Box::new(|s: &MemStore| {
                // Worker B records a failure between A's read and write.
                let (t, _) = record_shared(s, &k, &c, fail(), false, T0, 8).unwrap();
                assert_eq!(t, None);
            })),
            armed: Cell::new(1),
        };
        let (t, st) = record_shared(&racing, &k, &c, fail(), false, T0, 8).unwrap();
        assert_eq!(st.retries, 1);
        // 3 + B's + A's = 5: A's retried write is the one that trips the breaker.
        assert_eq!(t.map(|t| t.reason), Some("failure_threshold"));
        let (s, _) = store::peek::<BreakerState>(&store, &k).unwrap();
        assert_eq!(s.map(|s| s.state()), Some(State::Open));
    }

    #[test]
    fn closed_admission_on_an_existing_key_writes_nothing() {
        let store = MemStore::new();
        let k = key("model", "m");
        admit_shared(&store, &k, &cfg(), T0, 8).unwrap();
        let (_, cas0) = store.get(&k).unwrap().unwrap();
        let (a, t, st) = admit_shared(&store, &k, &cfg(), T0, 8).unwrap();
        assert_eq!((a, t, st.created), (Admission::Allowed, None, false));
        assert_eq!(store.get(&k).unwrap().unwrap().1, cas0);
        assert_eq!(store.len(), 1);
    }
}
