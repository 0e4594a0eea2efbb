//! One quota or budget reservation of a request and its lifecycle ([`Hold`]): planned, sent, held by
//! Redis, by this Envoy's lease or by nobody (the shim was down), or of unknown outcome; then settled.
//! A leaf: the request's state, its refusals and the steps all name it.

use crate::quota::accounting::{Reserved, UsageSource};
use crate::quota::{ReserveArgs, ReserveReply};

/// How a callout was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(in crate::flow) struct Sent {
    /// As `EVAL` (Redis did not know the script, or it is the first call).
    pub eval: bool,
    /// It is the shim breaker's half-open probe.
    pub probe: bool,
    /// Waiting in this VM's batch of reservations (`flow::vm::batch`): its answer comes from the
    /// batch's call, read by the root.
    pub batched: bool,
}

/// Where a reservation is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::flow) enum Hold {
    /// Not sent (yet, or again).
    Planned,
    /// Its reservation callout is in flight.
    Sent(Sent),
    /// This Envoy's lease of the account is being given back (its call in flight; `eval`: sent again as
    /// `EVAL` after a NOSCRIPT) before the reservation is sent again; nothing is reserved meanwhile.
    GivingBack {
        /// Sent again as `EVAL`.
        eval: bool,
    },
    /// Redis holds it.
    Redis,
    /// This Envoy's lease holds it: the account's shared-data key (settled into it, not through Redis).
    Lease(String),
    /// Admitted while the shim could not answer (`on_failure: open`): nothing known reserved; charged
    /// what it cost at the end. `uncertain`: its callout may have reserved after all (reconciled, also
    /// when a later step refuses the request).
    FailOpen {
        /// The failed callout may have reserved.
        uncertain: bool,
    },
    /// Its callout failed in a way that may still have reserved (timeout, garbage): reconciled — charged
    /// what it cost, whatever the lost reservation did — at the end.
    Uncertain,
    /// Settled (or given back).
    Settled,
}

/// One request's quota reservation.
#[derive(Debug, Clone)]
pub(in crate::flow) struct QuotaReq {
    /// What a reservation callout sends (its Redis keys are built from it when needed, never for a
    /// request served from a lease).
    pub args: ReserveArgs,
    pub reserved: Reserved,
    pub expire_at: i64,
    pub limit: u64,
    pub remaining: Option<u64>,
    /// When the reservation's month ends (unix seconds, on the quota's clock): the reset every
    /// answer names, with the seconds to it counted from the answer's own clock.
    pub reset_at: i64,
    /// Where it is in its life.
    pub hold: Hold,
    /// Redis' refusal of this reservation, which is being sent again (once) after this Envoy's lease
    /// of the account went back: the answer if what follows fails.
    pub refusal: Option<ReserveReply>,
    /// What this Envoy's lease of the account held unspent when the reservation was sent (a sync may
    /// give it back before Redis' answer comes).
    pub lease_available: u64,
    pub choices: u64,
    pub actual: Option<u64>,
    pub source: Option<UsageSource>,
    /// The budget (index in `quota.budgets`) this reservation is for; `None`: the token quota.
    pub budget: Option<usize>,
}

impl QuotaReq {
    /// Settled (or given back): nothing left to do for it.
    pub fn settled(&self) -> bool {
        self.hold == Hold::Settled
    }

    /// Reserved — by Redis, a lease, or admitted with nothing reserved (`on_failure: open`).
    pub fn answered(&self) -> bool {
        matches!(
            self.hold,
            Hold::Redis | Hold::Lease(_) | Hold::FailOpen { .. }
        )
    }

    /// Admitted while the shim could not answer.
    pub fn fail_open(&self) -> bool {
        matches!(self.hold, Hold::FailOpen { .. })
    }

    /// Of unknown outcome (a callout that may have reserved): reconciled at the end.
    pub fn uncertain(&self) -> bool {
        matches!(
            self.hold,
            Hold::Uncertain | Hold::FailOpen { uncertain: true }
        )
    }
}
